"""The tar writer's per-member fast paths (issue 28 item 3): add() joins a run of small members' pieces
itself, _put frames a plain ustar member inline, member_size skips encoding plain names. Each must give
the bytes and sizes of the general path: checked against Python's tarfile, against add_samples (the
batch path), and against the sizes the bytes really take, for names and sizes on both sides of every
boundary (100-byte names, non-ASCII and surrogate-escaped names, members of 256 KiB and up, empty ones).
"""

from __future__ import annotations

import io
import tarfile

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.shards.tar_write import TarStreamWriter

_BIG = 1 << 18  # the size from which a member stays a piece of its own (tar_write._BIG)

_NAMES = ["a.bin", "k" * 96 + ".bin", "k" * 97 + ".bin", "k" * 200 + ".txt", "dir/sub/x.y.z", "é.txt",
          "caf\udce9.bin", "x" * 100, "x" * 101]
_SIZES = [0, 1, 511, 512, 513, _BIG - 1, _BIG, _BIG + 1, 3 << 20]


def _payload(i: int, size: int) -> bytes:
    return bytes((i * 7 + j) % 251 for j in range(min(size, 4096))) * (size // 4096) + bytes(size % 4096)


def _write(calls: list) -> bytes:
    """Run add() / add_samples() calls in order on one writer; the archive's bytes."""
    out = io.BytesIO()
    writer = TarStreamWriter(out)
    for kind, arg in calls:
        if kind == "add":
            writer.add(*arg)
        else:
            assert writer.add_samples(arg, float("inf")) == len(arg)
    writer.finish()
    assert writer.bytes_written == len(out.getvalue())
    return out.getvalue()


def _members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


def test_add_member_by_member_reads_back_and_equals_the_batch_path():
    members = [(f"{i:03d}-{name}", _payload(i, size)) for i, (name, size) in
               enumerate((n, s) for n in _NAMES for s in _SIZES[:7])]
    members += [("big.bin", _payload(1, 3 << 20)), ("after-big.txt", b"tail")]
    one_by_one = _write([("add", m) for m in members])
    batched = _write([("samples", [[m] for m in members])])
    assert one_by_one == batched
    assert _members(one_by_one) == members


def test_add_and_add_samples_interleaved_keep_their_order():
    """add() holds small members in a run: add_samples, flush and finish must hand it on first."""
    calls = [("add", ("s1.a", b"x" * 100)), ("add", ("s1.b", b"y" * 700)),
             ("samples", [[("s2.a", b"z" * 50)], [("s3.a", b"w" * (_BIG + 5))]]),
             ("add", ("s4.a", b"v" * 10)), ("samples", [[("s5.a", b"u")]]), ("add", ("s6.a", b""))]
    data = _write(calls)
    expected = [("s1.a", b"x" * 100), ("s1.b", b"y" * 700), ("s2.a", b"z" * 50), ("s3.a", b"w" * (_BIG + 5)),
                ("s4.a", b"v" * 10), ("s5.a", b"u"), ("s6.a", b"")]
    assert _members(data) == expected
    assert data == _write([("add", m) for m in expected])


def test_flush_hands_on_the_pending_run():
    out = io.BytesIO()
    writer = TarStreamWriter(out)
    writer.add("k.bin", b"abc")
    assert out.getvalue() == b""  # held, below the batch size
    writer.flush()
    assert len(out.getvalue()) == writer.bytes_written == 1024
    assert _members(out.getvalue() + bytes(1024)) == [("k.bin", b"abc")]


def test_member_size_is_what_add_writes():
    for name in _NAMES:
        for size in (0, 1, 512, 1000):
            out = io.BytesIO()
            writer = TarStreamWriter(out)
            writer.add(name, bytes(size))
            writer.flush()
            assert TarStreamWriter.member_size(name, size) == len(out.getvalue()), (name, size)


_name_chars = st.sampled_from("abcXYZ09_-/.é\udce9")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(_name_chars, min_size=1, max_size=120).filter(lambda n: not n.endswith("/")),
                          st.sampled_from(_SIZES[:6])),  # tarfile drops a name's trailing '/'
                min_size=1, max_size=12),
       st.integers(min_value=0, max_value=3))
def test_any_names_and_sizes_frame_alike_on_both_paths(spec, split):
    members = [(f"m{i}{name}", _payload(i, size)) for i, (name, size) in enumerate(spec)]
    one_by_one = _write([("add", m) for m in members])
    head, tail = members[:split], members[split:]
    mixed = _write([("add", m) for m in head] + [("samples", [[m] for m in tail])])
    assert one_by_one == mixed
    assert _members(one_by_one) == members
    assert sum(TarStreamWriter.member_size(n, len(d)) for n, d in members) + 1024 == len(one_by_one)


class _Pieces:
    """A stream that keeps the pieces handed to it, as the writer's hashing sink receives them."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write_parts(self, parts: list[bytes]) -> None:
        self.pieces += parts


def test_large_members_are_handed_on_uncopied_and_small_ones_joined():
    big = _payload(3, _BIG + 100)
    sink = _Pieces()
    writer = TarStreamWriter(sink)
    for i in range(20):
        writer.add(f"s{i}.cls", b"%d" % i)
    writer.add("s20.bin", big)
    writer.add("s20.cls", b"x")
    writer.finish()
    assert any(piece is big for piece in sink.pieces)  # by reference, not copied into a batch
    assert len(sink.pieces) == 3  # the run up to big's header, big, and the rest with the end marker
    assert _members(b"".join(sink.pieces))[-2:] == [("s20.bin", big), ("s20.cls", b"x")]
