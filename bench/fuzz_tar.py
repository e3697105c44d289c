"""Fuzz the tar reader: N random valid shards, one random corruption each, read in skip and raise
mode; judged by the oracle of tests/tar_corruption.py (the property test's, with many more cases).

    PYTHONPATH=. python bench/fuzz_tar.py --cases 20000 --seed 1 [--writer tarfile-gnu|tarfile-pax]

Prints, per corruption kind, the runs, the cases no reader can judge (blind), partial or unknown
samples delivered, samples lost without a report, and tracebacks (any exception that is not a
ShardflowError). All but runs and blind must be 0; the first failing cases are printed to replay.
"""

from __future__ import annotations

import argparse
import random
import sys
import tarfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tar_corruption import KINDS, build, build_stdlib, corrupt, judge, judge_raise, random_spec, read  # noqa: E402

from shardflow.errors import ShardflowWarning  # noqa: E402

WRITERS = {
    "shardflow": build,
    "tarfile-gnu": lambda spec: build_stdlib(spec, tarfile.GNU_FORMAT),
    "tarfile-pax": lambda spec: build_stdlib(spec, tarfile.PAX_FORMAT),
}


def run(cases: int, seed: int, show: int, writer: str = "shardflow") -> int:
    rng = random.Random(seed)
    counts: dict[str, Counter] = {kind: Counter() for kind in KINDS}
    failures: list[str] = []
    start = time.perf_counter()
    for i in range(cases):
        spec = random_spec(rng)
        kind = rng.choice(KINDS)
        where, bit, fill = rng.randrange(1 << 30), rng.randrange(8), rng.choice([None, bytes(512)])
        row = counts[kind]
        row["runs"] += 1
        shard = WRITERS[writer](spec)
        case = corrupt(shard, kind, where, bit, fill)
        if case.blind is not None:
            row["blind"] += 1
            continue
        try:
            problems = judge(shard, case, read(case.bad, "skip")) + judge_raise(shard, case, read(case.bad, "raise"))
        except Exception:  # noqa: BLE001 - a traceback is what the fuzz run counts
            row["tracebacks"] += 1
            problems = [traceback.format_exc(limit=3)]
        for p in problems:
            row["partial" if "delivered" in p else "lost" if "lost" in p else "other"] += 1
        if problems and len(failures) < show:
            failures.append(f"case {i}: {kind} at {case.at} (where={where}, bit={bit}, fill={fill is not None})\n"
                            f"  spec={spec!r}\n  " + "\n  ".join(problems))
    seconds = time.perf_counter() - start
    print(f"{cases} cases, seed {seed}, shards written by {writer}, {seconds:.1f} s")
    print(f"{'kind':<14}{'runs':>8}{'blind':>8}{'partial':>9}{'lost':>7}{'other':>7}{'tracebacks':>12}")
    total = Counter()
    for kind, row in counts.items():
        total.update(row)
        print(f"{kind:<14}{row['runs']:>8}{row['blind']:>8}{row['partial']:>9}{row['lost']:>7}{row['other']:>7}"
              f"{row['tracebacks']:>12}")
    print(f"{'all':<14}{total['runs']:>8}{total['blind']:>8}{total['partial']:>9}{total['lost']:>7}"
          f"{total['other']:>7}{total['tracebacks']:>12}")
    for failure in failures:
        print(failure)
    return 1 if total["partial"] or total["lost"] or total["other"] or total["tracebacks"] else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="failing cases to print")
    parser.add_argument("--writer", choices=sorted(WRITERS), default="shardflow", help="who writes the shards")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShardflowWarning)
        sys.exit(run(args.cases, args.seed, args.show, args.writer))


if __name__ == "__main__":
    main()
