"""Fuzz the tar reader: N random valid shards, one random corruption each, read in skip and raise
mode; judged by the oracle of tests/support/tar_corruption.py (the property test's, with many more cases).

    .venv/bin/python bench/fuzz_tar.py --cases 30000 --seed 26 [--writer shardflow|tarfile-pax|tarfile-gnu]

Corruptions: a zeroed block, a bit flip, a truncation, a cut inside a member header (most often the
one after a pax/long-name record), an inserted or deleted block, a cut gzip stream, two blocks
swapped (a header may move into data, data into a header's place). Keys are now and then long or
non-ASCII, so the tarfile writers put pax/GNU records before their headers.

Prints, per corruption kind, the runs (cases), the cases no reader can judge (blind, with why), the
cases only in a documented blind spot (excused: a header swapped to where its size frames again, or
a pax/long-name record moved away from a member whose stand-in name reads as a name), the cases
where a sample was delivered and reported incomplete only later (split: a key that reappears, a
header of it found displaced further on; a streaming reader cannot do better, a job reruns the task
without the key), and the cases where (in skip or raise mode) a partial or unknown sample was
delivered (partial), a sample was lost without a report (lost), raise mode gave no error yet missed
samples (other), or any exception that is not a ShardflowError escaped (tracebacks). partial, lost,
other and tracebacks must be 0; the first failing cases are printed to replay; the slowest case
shows that none hangs. `--tgz-vs-webdataset` counts the samples of truncated
.tgz shards read by shardflow and by webdataset instead.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.support

from shardflow import ShardflowWarning  # noqa: E402
from tests.support.tar_corruption import (  # noqa: E402
    KINDS,
    WRITERS,
    build,
    build_with,
    corrupt,
    judge,
    judge_raise,
    random_spec,
    read,
)


def run(cases: int, seed: int, show: int, writer: str = "shardflow") -> int:
    rng = random.Random(seed)
    counts: dict[str, Counter] = {kind: Counter() for kind in KINDS}
    failures: list[str] = []
    blind_why: Counter = Counter()  # (kind, why) of the cases no reader can judge
    slowest = (0.0, -1)  # seconds, case: a hang would show here (and never end the run)
    start = time.perf_counter()
    for i in range(cases):
        spec = random_spec(rng)
        kind = rng.choice(KINDS)
        where, bit, fill = rng.randrange(1 << 30), rng.randrange(8), rng.choice([None, bytes(512)])
        row = counts[kind]
        row["runs"] += 1
        shard = build_with(writer, spec)
        case = corrupt(shard, kind, where, bit, fill)
        if case.blind is not None:
            row["blind"] += 1
            blind_why[(kind, case.blind)] += 1
            continue
        began = time.perf_counter()
        try:
            skip, raise_ = read(case.bad, "skip"), read(case.bad, "raise")
            problems = judge(shard, case, skip) + judge_raise(shard, case, raise_)
            row["split"] += bool(skip.split or raise_.split)
            row["excused"] += bool(skip.excused or raise_.excused)
        except Exception:  # noqa: BLE001 - a traceback is what the fuzz run counts
            row["tracebacks"] += 1
            problems = [traceback.format_exc(limit=3)]
        slowest = max(slowest, (time.perf_counter() - began, i))
        for what in {"partial" if "delivered" in p else "lost" if "lost" in p else "other" for p in problems}:
            row[what] += 1  # cases with at least one such problem
        if problems and len(failures) < show:
            failures.append(f"case {i}: {kind} at {case.at} (where={where}, bit={bit}, fill={fill is not None})\n"
                            f"  spec={spec!r}\n  " + "\n  ".join(problems))
    seconds = time.perf_counter() - start
    print(f"{cases} cases, seed {seed}, shards written by {writer}, {seconds:.1f} s")
    columns = ("runs", "blind", "excused", "split", "partial", "lost", "other", "tracebacks")
    print(f"{'kind':<14}" + "".join(f"{c:>11}" for c in columns))
    total: Counter = Counter()
    for kind, row in counts.items():
        total.update(row)
        print(f"{kind:<14}" + "".join(f"{row[c]:>11}" for c in columns))
    print(f"{'all':<14}" + "".join(f"{total[c]:>11}" for c in columns))
    for (kind, why), n in sorted(blind_why.items()):
        print(f"blind  {kind}: {why}: {n} ({100 * n / max(1, counts[kind]['runs']):.2f}% of {kind})")
    print(f"slowest case: {slowest[1]} ({slowest[0] * 1000:.0f} ms, both modes)")
    for failure in failures:
        print(failure)
    return 1 if total["partial"] or total["lost"] or total["other"] or total["tracebacks"] else 0


def tgz_vs_webdataset(seed: int) -> None:
    """Samples read from truncated .tgz shards (ImageNet-like sizes): shardflow vs webdataset."""
    import gzip
    import io
    import tempfile

    import webdataset as wds

    from shardflow import read_samples

    rng = random.Random(seed)
    spec = [(f"n{i:08d}", [("cls", "byte", 3), ("jpg", "rand", rng.randint(2_000, 60_000))]) for i in range(200)]
    packed = gzip.compress(build(spec).data, compresslevel=6)
    print(f"{'cut':>6}{'shardflow':>11}{'webdataset':>12}")
    for cut in (0.25, 0.5, 0.75, 0.9, 0.99):
        bad = packed[: int(len(packed) * cut)]
        ours = 0
        try:
            for _ in read_samples(io.BytesIO(bad), "mem://x.tgz", on_error="skip", report=lambda e: None):
                ours += 1
        except Exception:  # noqa: BLE001 - the truncation ends the shard
            pass
        theirs = 0
        with tempfile.NamedTemporaryFile(suffix=".tgz") as f:
            f.write(bad)
            f.flush()
            try:
                for _ in wds.WebDataset(f.name, shardshuffle=False, empty_check=False):
                    theirs += 1
            except Exception:  # noqa: BLE001 - webdataset raises what tarfile raises
                pass
        print(f"{cut:>6}{ours:>11}{theirs:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="failing cases to print")
    parser.add_argument("--writer", choices=WRITERS, default="shardflow", help="who writes the shards")
    parser.add_argument("--tgz-vs-webdataset", action="store_true", help="count samples of truncated .tgz instead")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardflowWarning)
        if args.tgz_vs_webdataset:
            sys.exit(tgz_vs_webdataset(args.seed))
        sys.exit(run(args.cases, args.seed, args.show, args.writer))


if __name__ == "__main__":
    main()
