"""What `shardflow status`, one `status --watch` poll and `shardflow report --json` cost on a run directory
of N tasks, in every state a run leaves it, built the way real runs leave it (issue 27 item 4, issue 28
item 7): every task's marker in run_task's shape with its record (rundir.records) beside it, an output
file per task in the output folder, a few tasks running, and the summaries real pods write.

States, in the order they are built on one run directory (pods of K=10 tasks, an Indexed Job):
  mid-run, markers     99% of tasks done, markers and records only (the processes backend, a killed driver)
  mid-run, pods        the same plus each finished pod's summary (N/10 summaries: what status used to GET)
  after Indexed Job    every task done, N/10 pod summaries, nothing merged them (no finalize on a k8s Job)
  after finalize       `shardflow worker --finalize` wrote SPAN summaries and summary.json

Each row: wall and CPU seconds of this process, S3 requests by method (botocore events; a LIST is a GET
with list-type=2). --memory N: the peak RSS of status's in-memory work at N tasks. Run:

  .venv/bin/python bench/scale_status.py --sizes 100000 [--local-sizes 100000,1000000] [--endpoint URL]

The machine is shared: note `uptime` with the figures; requests are exact, seconds are not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import scale  # noqa: E402
from scale import fresh_bucket, int_list, start_s3  # noqa: E402

from shardflow import ShardJob  # noqa: E402
from shardflow.rundir.layout import RECORDS, RUNNING, done_file  # noqa: E402
from shardflow.rundir.records import DONE, TaskRecord, running_name  # noqa: E402
from shardflow.rundir.stats import Stats  # noqa: E402
from shardflow.rundir.status import read_status  # noqa: E402
from shardflow.rundir.summaries import block_of, write_block  # noqa: E402
from shardflow.tools.report_data import collect  # noqa: E402

K = 10  # tasks per pod
T0 = time.time() - 3600


class Requests(scale.Requests):
    """scale.Requests, with a LIST (GET ?list-type=2) counted as LIST."""

    def _count(self, request: Any = None, **_: Any) -> None:
        listing = request.method == "GET" and "list-type=2" in request.url
        self.counts["LIST" if listing else request.method] += 1


def copy(sample: dict) -> dict:
    return sample


def _marker(t: int, out: str) -> tuple[dict[str, Any], TaskRecord]:
    """Task t's marker as run_task writes it, and its record."""
    stats = Stats(samples_in=10, samples_out=10, shards_in=1, shards_out=1, bytes_in=30720, bytes_out=30720,
                  seconds=0.5)
    record = TaskRecord(t, DONE, 1, T0 + t * 0.03, 0.5, 0.4, f"pod-{t // K:05d}~index{t // K}~p1", stats=stats)
    outputs = [{"url": f"{out}/in-{t:06d}.tar", "nsamples": 10, "nbytes": 30720, "sha256": "0" * 64}]
    return {"task": t, "inputs": [f"in-{t:06d}.tar"], "outputs": outputs, "stats": stats.to_json(),
            "record": record.to_json()}, record


def write_tasks(fs: Any, root: str, out: str, ids: range) -> None:
    """Markers, records and output files of tasks `ids`, in batches of concurrent PUTs (object stores)."""
    for start in range(ids.start, ids.stop, 2000):
        batch: dict[str, bytes] = {}
        for t in range(start, min(ids.stop, start + 2000)):
            marker, record = _marker(t, out)
            batch[f"{root}/{done_file(t)}"] = json.dumps(marker).encode()
            batch[f"{root}/{RECORDS}/{record.name()}"] = b""
            batch[f"{out}/in-{t:06d}.tar"] = b"\0" * 1024
        _put(fs, batch)


def _put(fs: Any, files: dict[str, bytes]) -> None:
    if fs is not None:  # an object store: concurrent PUTs
        fs.pipe(files)
        return
    for path, data in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def write_pod_summaries(rd: Any, out: str, first_pod: int, stop_pod: int) -> None:
    for pod in range(first_pod, stop_pod):
        parts = [_marker(t, out)[0] for t in range(pod * K, (pod + 1) * K)]
        write_block(rd, block_of(pod * K, (pod + 1) * K, ((Stats.from_json(p["stats"]), p["outputs"]) for p in parts)))


def measure(label: str, fn: Callable[[], Any], requests: Requests | None, *, heap: bool = False) -> dict[str, Any]:
    """Wall and CPU of fn (CPU includes the store client's event-loop thread: XML parsing); with heap, its
    peak Python heap too (tracemalloc, which slows allocation-heavy code several times: a separate run)."""
    if heap:
        tracemalloc.start()
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    row = {"what": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "requests": requests.take() if requests
           else "-"}
    if heap:
        row["heap_mb"] = round(tracemalloc.get_traced_memory()[1] / 1e6)
        tracemalloc.stop()
    return row


def rows_for(n: int, base: str, options: dict | None, requests: Requests | None) -> list[dict[str, Any]]:
    out = f"{base}/out"
    job = ShardJob(copy, f"{base}/in/in-{{000000..{n - 1:06d}}}.tar", f"{out}/{{name}}.tar", storage_options=options)
    job.prepare(overwrite=True)
    rd = job.rundir()
    fs = rd.fs if options else None
    if requests:
        requests.hook(rd.fs)
    done = n - n // 100  # 99%, whole pods
    done -= done % K
    t0 = time.perf_counter()
    write_tasks(fs, rd.path, out if options is None else out.split("://", 1)[1], range(0, done))
    for t in range(done, min(n, done + 5)):  # five tasks running in the next pods
        _put(fs, {f"{rd.path}/{RUNNING}/{running_name(t, time.time() - 60, f'pod-{t // K:05d}~p1')}": b""})
    print(f"# N={n}: {done} tasks written in {time.perf_counter() - t0:.0f} s", flush=True)
    if requests:
        requests.take()

    def status() -> Any:
        return read_status(job.run_dir, options)

    def poll_and_check() -> None:
        s = status()
        assert len(s.done) == s.stats.samples_in // 10 and s.tally is not None

    rows = [measure("status, mid-run, markers+records only", poll_and_check, requests)]
    write_pod_summaries(rd, out, 0, done // K)
    if requests:
        requests.take()
    rows.append(measure("status, mid-run, pods' summaries", poll_and_check, requests))
    rows.append(measure("report --json, mid-run", lambda: collect(job.run_dir, options), requests))
    write_tasks(fs, rd.path, out if options is None else out.split("://", 1)[1], range(done, n))
    write_pod_summaries(rd, out, done // K, -(-n // K))
    if requests:
        requests.take()
    rows.append(measure(f"status, after an Indexed Job ({-(-n // K)} pod summaries)", poll_and_check, requests))
    rows.append(measure("report --json, after an Indexed Job", lambda: collect(job.run_dir, options), requests))
    final = subprocess.run([sys.executable, "-m", "shardflow", "worker", "--run-dir", job.run_dir, "--finalize"],
                           capture_output=True, text=True, env=dict(os.environ))
    assert final.returncode == 0, final.stderr[-2000:]
    if requests:
        requests.take()
    rows.append(measure("status, after finalize", poll_and_check, requests))
    rows.append(measure("report --json, after finalize", lambda: collect(job.run_dir, options), requests))
    return rows


def memory_row(n: int) -> dict[str, Any]:
    """Peak memory of status's in-memory work at N tasks (run first, in a fresh process): the listings
    of done/ and records/ as they come back (N names each), the done set and the tally (no store: what
    the listings hold, not how a store's client builds them). Readers used to hold every marker
    (status with markers only at 1M: 3.2 GB)."""

    from shardflow.rundir.tally import tally

    t0, cpu0 = time.perf_counter(), time.process_time()
    done_names = [f"{t:06d}.json" for t in range(n)]
    done = {int(name.split(".")[0]) for name in done_names}
    records = [_marker(t, "out")[1].name() for t in range(n)]
    result = tally(n, records, done)
    assert result.done == n
    peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024  # this process's peak RSS
    return {"store": "memory", "N": n, "what": "status's listings + tally (peak RSS of the process, imports included)",
            "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - cpu0, 2),
            "rss_mb": round(peak)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="N on S3 (SeaweedFS)")
    parser.add_argument("--local-sizes", default="100000", help="N on a local run directory")
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--memory", default="", help="N for the in-memory peak of status's listings (e.g. 1000000)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-status-", dir=args.tmp)
    server = None
    rows: list[dict[str, Any]] = []
    print("# uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    try:
        for n in int_list(args.memory):
            rows.append(memory_row(n))
            print(json.dumps(rows[-1]), flush=True)
        for n in int_list(args.local_sizes):
            for row in rows_for(n, f"{tmp}/local-{n}", None, None):
                rows.append({"store": "local", "N": n, **row})
                print(json.dumps(rows[-1]), flush=True)
        sizes = int_list(args.sizes)
        if sizes:
            server, options = start_s3(args, tmp)
            for n in sizes:
                for row in rows_for(n, fresh_bucket(options, "status"), options, Requests()):
                    rows.append({"store": "s3", "N": n, **row})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("# uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print("\n# results")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
