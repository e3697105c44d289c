"""The run-dir readers at N tasks when only markers are there (issue 28, item 7: "with markers only at 1M,
status peaks at 3.2 GB, finalize at 4.35 GB, resume at 4.8 GB"; target: under 500 MB at 1M).

"Markers only" is what a run leaves when every task finished but nothing merged them: the driver was
killed before its report, or pods of K = 1 ran without a finalize step. The local run dir holds the plan,
N done markers in run_task's shape with their records/ names, and N output shards in the output folder
(bench/scale.py's write_markers and realistic_run_dir, without the per-chunk summaries). Each reader runs
in a fresh process, from that state (what an earlier reader wrote, summaries and summary.json, is removed
first), and reports wall seconds and its peak RSS (VmHWM), imports included:

  status      `shardflow status RUN_DIR`
  finalize    `shardflow worker --run-dir RUN_DIR --finalize` (writes the summaries and summary.json)
  resume      a no-op `job.run("serial")` of the same job (every task done)

    .venv/bin/python bench/bench_markers_only.py --tasks 1000000 --keep /var/tmp/markers-1m

Building 1M markers, records and outputs takes ~4 minutes and ~3 M files (--keep reuses them; remove the
folder by hand: deleting 3 M files slows this disk for minutes, see bench_tiny_tasks.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import scale  # bench/scale.py: the run-dir builders and the child-process measurements

from shardflow import ShardJob  # importable: scale put the repository on sys.path
from shardflow.rundir.layout import LAST_RUN, SUMMARIES, SUMMARY


def build(n: int, base: Path) -> tuple[str, str, str]:
    """(input spec, output folder, run dir) of a finished N-task run with markers only; built once per --keep."""
    spec, out = f"{base}/in/in-{{000000..{n - 1:06d}}}.tar", f"{base}/out"  # realistic_run_dir's names
    run_dir = ShardJob(scale._resume_fn(), spec, f"{out}/{{name}}.tar").run_dir  # the default, as the child finds it
    built = base / "built.json"
    if not built.exists():
        started = time.perf_counter()
        scale.realistic_run_dir(n, str(base), None, summaries=False)
        built.write_text(json.dumps({"tasks": n}))
        print(f"# built {n} markers, records and outputs in {time.perf_counter() - started:.0f} s", flush=True)
    return spec, out, run_dir


def markers_only(run_dir: str) -> None:
    """Back to markers only: what a reader merged (per-chunk summaries, summary.json) removed."""
    shutil.rmtree(f"{run_dir}/{SUMMARIES}", ignore_errors=True)
    for name in (SUMMARY, LAST_RUN):
        Path(run_dir, name).unlink(missing_ok=True)


def cli(args: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run(scale._hwm_command(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{args} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"wall_s": round(time.perf_counter() - started, 1), "rss_mb": scale._hwm_mb(done.stderr)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--keep", default=None, help="build the run dir here once and reuse it")
    args = parser.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="bench-markers-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        spec, out, run_dir = build(args.tasks, base)
        rows = []
        for what, measure in (("status", lambda: cli(["status", run_dir])),
                              ("worker --finalize", lambda: cli(["worker", "--run-dir", run_dir, "--finalize"])),
                              ("no-op resume", lambda: scale._resume_once(str(scale.REPO), None, spec, out,
                                                                          args.tasks))):
            markers_only(run_dir)
            rows.append({"what": what, "N": args.tasks, **measure()})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
