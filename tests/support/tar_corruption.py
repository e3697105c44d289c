"""Valid generated shards, one corruption each, and the oracle that judges what the reader made of
the corrupted bytes. Shared by the property test (test_tar_damage_property.py) and the longer fuzz run
(bench/fuzz_tar.py).

The oracle: every delivered sample equals an original sample exactly; every original sample not
delivered is reported, by key or by lying in a damaged region the reader reported (from its offset
to where reading resumed) or after the offset of the error that ended the shard. Corruption of
bytes no tar checksum covers (member data) is data, not damage: the expected sample then holds the
corrupted bytes. Three corruptions no reader can see are excluded (`Case.blind`): a flip inside a
pax record (a different, valid name), a deleted block that was the header of an empty member (a
valid tar without it remains; a pax header it had then names the next member), and damage that
leaves nothing but zeros from a member's header to the end (it reads as the end of the archive).
"""

from __future__ import annotations

import gzip
import io
import random
import re
import tarfile
from dataclasses import dataclass, field

from shardflow.errors import FormatError, SampleError, ShardflowError
from shardflow.shards.samples import read_samples
from shardflow.shards.tar_headers import BLOCK
from shardflow.shards.tar_write import TarStreamWriter

KINDS = ("zero_block", "bit_flip", "truncate", "insert_block", "delete_block", "gzip_truncate", "header_cut",
         "block_swap")
EXTS = ("cls", "jpg", "json", "txt")
NON_ASCII = ("kéy", "日本", "ß-")  # key stems only a pax (or GNU) record holds whole: '?' or '@LongName' in ustar
WRITERS = ("shardflow", "tarfile-pax", "tarfile-gnu")
INF = 1 << 62


@dataclass
class Shard:
    data: bytes
    samples: list[dict]
    spans: dict[str, tuple[int, int]]  # key -> [first byte, end) of its members (pax headers included)
    member_starts: list[int]  # where each member's region starts (its pax header, or its header)
    empty_headers: set[int]  # offsets of the header of empty members
    data_ranges: list[tuple[int, int, str, str]]  # [start, end) of regular member data, key, ext
    meta_ranges: list[tuple[int, int]]  # [start, end) of pax headers and their records


def payload(kind: str, size: int, seed: str) -> bytes:
    if kind == "zero":
        return bytes(size)
    if kind == "byte":
        return bytes([len(seed) % 251 + 1]) * size
    return random.Random(seed).randbytes(size)


def build_stdlib(spec: list[tuple[str, list[tuple[str, str, int]]]], fmt: int) -> Shard:
    """The same shard written by Python's tarfile (GNU long names, pax headers, 10 KiB records)."""
    buf = io.BytesIO()
    samples = []
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for key, members in spec:
            sample = {"__key__": key}
            for ext, kind, size in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = size, 1_700_000_000
                sample[ext] = payload(kind, size, f"{key}.{ext}")
                tf.addfile(info, io.BytesIO(sample[ext]))
            samples.append(sample)
    data = buf.getvalue()
    spans, starts, empty, data_ranges, meta = {}, [], set(), [], []
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            key, _, ext = m.name.partition(".")
            header = m.offset_data - BLOCK
            starts.append(m.offset)
            if header > m.offset:
                meta.append((m.offset, header))
            if m.size == 0:
                empty.add(header)
            data_ranges.append((m.offset_data, m.offset_data + m.size, key, ext))
            end = m.offset_data + m.size + (-m.size % BLOCK)
            spans[key] = (spans.get(key, (m.offset, 0))[0], end)
    return Shard(data, samples, spans, starts, empty, data_ranges, meta)


def build_with(writer: str, spec: list[tuple[str, list[tuple[str, str, int]]]]) -> Shard:
    """The shard of `spec` written by one of WRITERS."""
    if writer == "shardflow":
        return build(spec)
    return build_stdlib(spec, tarfile.PAX_FORMAT if writer == "tarfile-pax" else tarfile.GNU_FORMAT)


def tar_of(members: list[tuple[str, bytes]]) -> bytes:
    """A valid shard of the (name, data) members, in order, written by TarStreamWriter."""
    buf = io.BytesIO()
    writer = TarStreamWriter(buf)
    for name, data in members:
        writer.add(name, data)
    writer.finish()
    return buf.getvalue()


def build(spec: list[tuple[str, list[tuple[str, str, int]]]]) -> Shard:
    """A shard from [(key, [(ext, data kind, size), ...]), ...] written by TarStreamWriter."""
    buf = io.BytesIO()
    writer = TarStreamWriter(buf)
    samples, spans, starts, empty, data_ranges, meta = [], {}, [], set(), [], []
    for key, members in spec:
        sample = {"__key__": key}
        first = writer.bytes_written
        for ext, kind, size in members:
            body = payload(kind, size, f"{key}.{ext}")
            before = writer.bytes_written
            writer.add(f"{key}.{ext}", body)
            header = writer.bytes_written - BLOCK - size - (-size % BLOCK)
            starts.append(before)
            if header > before:
                meta.append((before, header))
            if size == 0:
                empty.add(header)
            data_ranges.append((header + BLOCK, header + BLOCK + size, key, ext))
            sample[ext] = body
        spans[key] = (first, writer.bytes_written)
        samples.append(sample)
    writer.finish()
    return Shard(buf.getvalue(), samples, spans, starts, empty, data_ranges, meta)


@dataclass
class Case:
    """One corruption of a shard: the corrupted bytes and what a correct reader must give."""

    kind: str
    at: int  # byte offset (bit_flip, truncate; gzip_truncate: in the compressed bytes) or block offset
    bad: bytes
    expected: dict[str, dict]  # key -> sample, with corrupted data bytes where the damage is data
    blind: str | None = None  # why no reader can see this corruption (the case is not judged)
    shift: tuple[int, int] = (INF, 0)  # offsets >= shift[0] move by shift[1] in the corrupted bytes
    swapped: tuple[int, int] | None = None  # block_swap: the offsets of the two blocks that traded places
    # block_swap: keys in a blind spot (a header moved to where it frames again, a stand-in name read
    # as a name): their samples may be delivered wrong or lost unreported; counted apart
    excused: set[str] = field(default_factory=set)

    def moved(self, offset: int) -> int:
        return offset + self.shift[1] if offset >= self.shift[0] else offset


def corrupt(shard: Shard, kind: str, where: int, bit: int = 0, fill: bytes | None = None) -> Case:
    """Apply one corruption; `where` is any integer, folded into the shard's length."""
    data = shard.data
    expected = {s["__key__"]: dict(s) for s in shard.samples}
    nblocks = len(data) // BLOCK
    if kind == "bit_flip":
        at = where % len(data)
        bad = bytearray(data)
        bad[at] ^= 1 << (bit % 8)
        case = Case(kind, at, bytes(bad), expected)
        _patch(case, shard, at, at + 1)
        if any(a <= at < b for a, b in shard.meta_ranges) and data[at] != 0:
            case.blind = "a flip inside a pax record"
    elif kind == "zero_block":
        at = (where % nblocks) * BLOCK
        case = Case(kind, at, data[:at] + bytes(BLOCK) + data[at + BLOCK :], expected)
        _patch(case, shard, at, at + BLOCK)
    elif kind == "truncate":
        at = where % len(data)
        case = Case(kind, at, data[:at], expected)
    elif kind == "gzip_truncate":  # offsets stay those of the tar (what the reader reports)
        packed = gzip.compress(data, compresslevel=1, mtime=0)
        at = where % len(packed)
        return Case(kind, at, packed[:at], expected)
    elif kind == "header_cut":  # cut inside a member header, most often one that follows a pax/long-name header
        headers = [b for _, b in shard.meta_ranges] or [a - BLOCK for a, _, _, _ in shard.data_ranges]
        at = headers[where % len(headers)] + 1 + (where >> 8) % (BLOCK - 1)
        case = Case(kind, at, data[:at], expected)
    elif kind == "block_swap":  # two blocks trade places: a header may move into data, data into a header
        i = where % nblocks
        j = (i + 1 + (where >> 12) % max(1, nblocks - 1)) % nblocks if bit % 2 else min(nblocks - 1, i + 1 + bit)
        i, j = min(i, j), max(i, j)
        a, b = i * BLOCK, j * BLOCK
        bad = data[:a] + data[b : b + BLOCK] + data[a + BLOCK : b] + data[a : a + BLOCK] + data[b + BLOCK :]
        case = Case(kind, a, bad, expected)
        case.swapped = (a, b)
        _patch(case, shard, a, a + BLOCK)
        _patch(case, shard, b, b + BLOCK)
    elif kind == "insert_block":
        at = (where % (nblocks + 1)) * BLOCK
        block = fill if fill is not None else random.Random(where).randbytes(BLOCK)
        case = Case(kind, at, data[:at] + block + data[at:], expected, shift=(at, BLOCK))
    else:
        at = (where % nblocks) * BLOCK
        case = Case(kind, at, data[:at] + data[at + BLOCK :], expected, shift=(at + BLOCK, -BLOCK))
        if at in shard.empty_headers:
            case.blind = "a deleted block that was the header of an empty member"
    if kind in ("insert_block", "delete_block", "block_swap"):
        _same_members(case, shard)
    if kind == "block_swap" and _names_traded(case, shard):
        case.blind = "two headers (or pax/long-name records) swapped: a valid tar whose members traded names or sizes"
    elif kind == "block_swap":
        case.excused = _stand_in_reads_as_a_name(case, shard) | _frames_elsewhere(case, shard)
    zeros_from = len(case.bad.rstrip(b"\0"))
    if any(zeros_from <= case.moved(s) < len(case.bad) for s in shard.member_starts):
        case.blind = "only zeros from a member's header to the end: reads as the end of the archive"
    return case


def _same_members(case: Case, shard: Shard) -> None:
    """A block inserted into or deleted from member data that leaves a valid tar with the same
    members (Python's tarfile is the judge): the framing cannot show it, the data changed."""
    try:
        with tarfile.open(fileobj=io.BytesIO(case.bad), mode="r:") as tf:
            got = [(m.name, m.size, tf.extractfile(m).read()) for m in tf.getmembers()]
    except (tarfile.TarError, OSError, EOFError):
        return
    names = [(f"{s['__key__']}.{ext}", len(s[ext])) for s in shard.samples for ext in s if ext != "__key__"]
    if [(n, size) for n, size, _ in got] != names:
        return
    for name, _, body in got:
        key, ext = name.rsplit("/", 1)[0] + "/" if "/" in name else "", name.rsplit("/", 1)[-1]
        key, _, ext = (key + ext).partition(".")
        case.expected[key][ext] = body


def _names_traded(case: Case, shard: Shard) -> bool:
    """Whether the corrupted bytes are a valid tar (Python's tarfile reads it whole) holding the
    original member names in another order, or with other sizes (two headers whose names live in
    pax/long-name records swapped: the members traded sizes within their block count): nothing in
    the framing shows it."""
    try:
        with tarfile.open(fileobj=io.BytesIO(case.bad), mode="r:") as tf:
            got = [(m.name, m.size) for m in tf.getmembers()]
    except (tarfile.TarError, OSError, EOFError):
        return False
    names = [(f"{s['__key__']}.{ext}", len(s[ext])) for s in shard.samples for ext in s if ext != "__key__"]
    return got != names and sorted(n for n, _ in got) == sorted(n for n, _ in names)


def _stand_in_reads_as_a_name(case: Case, shard: Shard) -> set[str]:
    """Blind spot: a block of a pax/long-name record moved (block_swap) away from a member whose own
    ustar name (the writer's stand-in: truncated, '?' for non-ASCII) still reads as a member name:
    the member is read under that name. The keys (real and stand-in) whose samples may be wrong."""
    keys: set[str] = set()
    for moved in case.swapped or ():
        for start, end in shard.meta_ranges:
            if start <= moved < end:
                header = _header_of(shard.data[end : end + BLOCK])
                real = [key for first, _, key, _ in shard.data_ranges if first == end + BLOCK]
                if header is not None and real and "." in header.name.rsplit("/", 1)[-1]:
                    keys |= {real[0], header.name.partition(".")[0]}
    return keys


def _frames_elsewhere(case: Case, shard: Shard) -> set[str]:
    """The key of a member header moved (block_swap) to a block where it reads as a member: no tar
    header inside the data its size claims, a header or zeros right after it. Its own data stayed
    behind, so no reader can tell the bytes it reads there are not its own (its sample may be
    delivered with them before the damage its absence made shows, or after it)."""
    a, b = case.swapped or (0, 0)
    excused: set[str] = set()
    for old, new in ((a, b), (b, a)):
        keys = [key for start, _, key, _ in shard.data_ranges if start == old + BLOCK]
        claimed = _frames_at(case.bad, new)
        if keys and claimed is not None:
            # and the members whose headers its data swallowed, when those bytes read as a tar (a
            # member that is itself a tar is data to the reader: tests/shards/test_tar_displaced.py)
            excused |= {keys[0]} | {key for start, _, key, _ in shard.data_ranges if claimed[0] < start <= claimed[1]}
    return excused


def _frames_at(bad: bytes, b: int) -> tuple[int, int] | None:
    """[start, end) of the data a header at `b` claims when it frames there: a header or zeros right
    after; inside, no header, or a whole tar (a header first, two zero blocks last)."""
    info = _header_of(bad[b : b + BLOCK])
    if info is None:
        return None
    size = info.size
    end = b + BLOCK + size + (-size % BLOCK)
    blocks = [bad[o : o + BLOCK] for o in range(b + BLOCK, end, BLOCK)]
    after = bad[end : end + BLOCK]
    data = bad[b + BLOCK : b + BLOCK + size]
    inside_ok = not any(_is_header(block) for block in blocks) or (
        bool(blocks) and _is_header(blocks[0]) and data.endswith(bytes(2 * BLOCK)))
    frames = inside_ok and len(after) == BLOCK and (after == bytes(BLOCK) or _is_header(after))
    return (b + BLOCK, end) if frames else None


def _header_of(block: bytes) -> tarfile.TarInfo | None:
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.TarError:
        return None


def _is_header(block: bytes) -> bool:
    return _header_of(block) is not None


def _patch(case: Case, shard: Shard, start: int, end: int) -> None:
    """Corrupted bytes inside member data are data: the expected sample holds them."""
    for a, b, key, ext in shard.data_ranges:
        if a < end and start < b:
            lo, hi = max(a, start), min(b, end)
            value = bytearray(case.expected[key][ext])
            value[lo - a : hi - a] = case.bad[lo:hi]
            case.expected[key][ext] = bytes(value)


@dataclass
class Outcome:
    samples: list[dict] = field(default_factory=list)
    errors: list[ShardflowError] = field(default_factory=list)
    end: ShardflowError | None = None  # the error that ended the shard, if any
    # keys delivered not whole and reported incomplete later (a key that reappears later, a header of
    # it found displaced later): a streaming reader can only report those after the fact (jobs hold
    # them back: they rerun the task without the key)
    split: set[str] = field(default_factory=set)
    excused: set[str] = field(default_factory=set)  # keys delivered wrong or lost in a blind spot (Case.excused)


def read(bad: bytes, on_error: str) -> Outcome:
    """Read the corrupted bytes; any exception other than a ShardflowError propagates (a bug)."""
    out = Outcome()
    try:
        for sample in read_samples(io.BytesIO(bad), "mem://fuzz.tar", on_error=on_error, report=out.errors.append):
            out.samples.append({k: v for k, v in sample.items() if k != "__url__"})
    except ShardflowError as exc:
        out.end = exc
    return out


_RESUMED = re.compile(r"^damaged up to offset (\d+) \(reading resumed there\)")


def judge(shard: Shard, case: Case, out: Outcome) -> list[str]:
    """What the reader got wrong: partial or unknown samples delivered, samples lost unreported."""
    problems = []
    delivered = set()
    errors = out.errors + ([out.end] if out.end is not None else [])
    # reported after delivery: a key that reappears later, or a header of it found displaced later
    reappeared = {e.key for e in errors if isinstance(e, SampleError) and "incomplete" in e.reason}
    for sample in out.samples:
        key = sample["__key__"]
        if sample != case.expected.get(key):
            if key in reappeared and key in case.expected:
                out.split.add(key)
            elif key in case.excused:
                out.excused.add(key)
            else:
                problems.append(f"delivered a sample that is not an original one: {key!r}")
        if key in delivered:
            problems.append(f"delivered twice: {key!r}")
        delivered.add(key)
    keys = {e.key for e in errors}
    regions = []
    for e in out.errors:
        if isinstance(e, FormatError) and e.offset is not None:
            found = _RESUMED.search(e.reason)
            regions.append((e.offset, int(found.group(1)) if found else INF))
    if out.end is not None and out.end.offset is not None:
        regions.append((out.end.offset, INF))
    for key, (start, end) in shard.spans.items():
        if key in delivered or key in keys:
            continue
        lo, hi = case.moved(start), case.moved(end)
        if any(lo < b and a < hi for a, b in regions):
            continue
        if key in case.excused:
            out.excused.add(key)
        else:
            problems.append(f"sample {key!r} [{lo}, {hi}) lost without a report")
    return problems


def judge_raise(shard: Shard, case: Case, out: Outcome) -> list[str]:
    """Under raise: what was delivered before the error is exact; without an error, everything."""
    problems = [p for p in judge(shard, case, out) if "lost" not in p]
    if out.end is None and len(out.samples) != len(shard.samples):
        problems.append("no error raised, yet samples are missing")
    return problems


def random_spec(rng: random.Random, n: int | None = None) -> list[tuple[str, list[tuple[str, str, int]]]]:
    """A random valid shard spec (for the fuzz run; the property test draws its own with hypothesis)."""
    spec = []
    for i in range(n or rng.randint(1, 8)):
        draw = rng.random()  # now and then a name that needs a pax or long-name record: long, or non-ASCII
        key = ("d" * rng.randint(95, 130) + f"/{i}") if draw < 0.1 else NON_ASCII[i % 3] + str(i) if draw < 0.2 else (
            f"s{i:04d}")
        exts = rng.sample(EXTS, rng.randint(1, 3))
        sizes = [rng.choice([0, 1, 100, 511, 512, 513, 1024, rng.randint(0, 3000)]) for _ in exts]
        spec.append((key, [(e, rng.choice(["rand", "rand", "zero", "byte"]), s) for e, s in zip(sorted(exts), sizes)]))
    return spec
