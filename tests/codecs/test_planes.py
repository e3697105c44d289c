"""HWC -> CHW (codecs/planes.py): OpenCV's channel split where it applies, numpy elsewhere; the same
values either way, written into the caller's buffer when one is given."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
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


def _opencv_threads(sample):
    from shardflow.codecs.planes import _cv2

    to_planes(np.zeros((2, 2, 3), np.uint8))  # loads OpenCV in this worker
    sample["threads.txt"] = str(_cv2().getNumThreads())
    return sample


@pytest.mark.slow
def test_pool_workers_run_opencv_on_one_thread(tmp_path, monkeypatch):
    """Worker processes run side by side: like torch, OpenCV gets one thread in each (with the default
    of all cores it took twice the CPU for the same split), also when the driver sets OMP_NUM_THREADS
    after its fork server started (the server's environment is older: the count is passed on)."""
    import shardflow as sf
    from shardflow.shards.writer import ShardWriter

    with ShardWriter(str(tmp_path / "in-%02d.tar"), maxcount=1) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "txt": b"x"})
    for run in range(2):
        if run == 1:
            monkeypatch.setenv("OMP_NUM_THREADS", "1")
        out = tmp_path / f"out{run}"
        sf.ShardJob(_opencv_threads, inputs=str(tmp_path / "in-{00..03}.tar"), outputs=str(out / "{name}.tar"),
                    decode=None).run("processes", workers=2)
        got = [s["threads.txt"] for p in sorted(out.glob("*.tar")) for s in sf.read_samples(str(p))]
        assert got == [b"1"] * 4, run


def _threads_field(sample):
    from shardflow.codecs.planes import _cv2

    to_planes(np.zeros((2, 2, 3), np.uint8))
    return {"threads": _cv2().getNumThreads()}


def test_loader_workers_run_opencv_on_one_thread(tmp_path):
    """DataLoader workers: torch runs one intra-op thread in each, and so does OpenCV."""
    pytest.importorskip("torch")
    import shardflow as sf
    from shardflow.shards.writer import ShardWriter

    with ShardWriter(str(tmp_path / "in-%02d.tar"), maxcount=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "txt": b"x"})
    ds = sf.ShardDataset(sorted(str(p) for p in tmp_path.glob("in-*.tar")), decode=None, map=_threads_field,
                         manifest=False)
    assert sorted(s["threads"] for s in sf.Loader(ds, num_workers=2)) == [1] * 4


_PRELOAD_CHECK = """
import io, sys
import numpy as np
from PIL import Image
import shardflow as sf
from shardflow.shards.writer import ShardWriter

WORKER_START = {}

def at_start(worker_id):
    WORKER_START["cv2"] = "cv2" in sys.modules  # before this worker decoded anything

def report(sample):
    import cv2
    return {"loaded_at_start": WORKER_START["cv2"], "threads": cv2.getNumThreads()}

if __name__ == "__main__":
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, "JPEG")
    with ShardWriter(sys.argv[1] + "/in-%02d.tar", maxcount=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "jpg": buf.getvalue()})
    assert "cv2" not in sys.modules
    ds = sf.ShardDataset([sys.argv[1] + f"/in-{i:02d}.tar" for i in range(2)], decode="torchrgb8", map=report,
                         manifest=False)
    got = list(sf.Loader(ds, num_workers=2, worker_init_fn=at_start))
    import cv2
    print(sorted((s["loaded_at_start"], s["threads"]) for s in got), cv2.getNumThreads() >= 1)
"""


@pytest.mark.slow
def test_loader_loads_opencv_once_before_forking_its_workers(tmp_path):
    """A Loader that decodes images loads OpenCV before it forks its workers (each would otherwise
    load it on its first image, ~15 ms on the way to its first batch); the workers still run it on
    one thread."""
    pytest.importorskip("torch")
    assert _cv2() is not None, "OpenCV (the fast extra) is not installed"
    script = tmp_path / "check.py"
    script.write_text(_PRELOAD_CHECK)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout.strip()
    assert out == "[(True, 1), (True, 1), (True, 1), (True, 1)] True"
