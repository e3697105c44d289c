"""HWC -> CHW (codecs/planes.py): OpenCV's channel split where it applies, numpy elsewhere; the same
values either way, written into the caller's buffer when one is given."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shardflow.codecs.planes import _cv2, to_planes

DTYPES = st.sampled_from([np.uint8, np.uint16, np.float32, np.int64, np.bool_])


@st.composite
def images(draw):
    h, w, c = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    a = draw(arrays(draw(DTYPES), (h, w, c)))
    if draw(st.booleans()):  # a view that is not C-contiguous (a crop)
        a = a[:, ::2] if w > 1 else a
    return a


@settings(max_examples=200, deadline=None)
@given(images(), st.booleans())
def test_planes_equal_numpy_transpose(hwc, into):
    want = hwc.transpose(2, 0, 1)
    if into:
        batch = np.zeros((3, *want.shape), hwc.dtype)
        got = to_planes(hwc, batch[1])
        assert got is batch[1] or np.shares_memory(got, batch)
        assert not batch[0].any() and not batch[2].any()  # nothing written outside its row
        got = batch[1]
    else:
        got = to_planes(hwc)
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # NaNs too: the same bits


def test_opencv_is_used_for_rgb_bytes_when_installed():
    """The fast path really runs (CI installs the `fast` extra): an RGB uint8 image is split by cv2."""
    assert _cv2() is not None, "OpenCV (the fast extra) is not installed"
    hwc = np.random.default_rng(0).integers(0, 255, (64, 48, 3), dtype=np.uint8)
    assert np.array_equal(to_planes(hwc), hwc.transpose(2, 0, 1))


def test_same_planes_without_opencv():
    """With OpenCV absent (its import fails) numpy writes the same planes."""
    code = (
        "import sys; sys.modules['cv2'] = None\n"
        "import numpy as np\n"
        "from shardflow.codecs.planes import _cv2, to_planes\n"
        "assert _cv2() is None\n"
        "a = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)\n"
        "print(to_planes(a).tobytes().hex())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    a = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    assert bytes.fromhex(out) == a.transpose(2, 0, 1).tobytes()
