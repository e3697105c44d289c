"""The Dask backend on a real cluster: `dask scheduler` + `dask worker` processes (conftest's
dask_cluster) and a LocalCluster. Nothing is mocked: workers are SIGKILLed, the scheduler too.
"""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install -e '.[dask]')")

import shardflow as sf  # noqa: E402
from shardflow.backends.dask import execute_dask  # noqa: E402
from shardflow.errors import JobError  # noqa: E402
from shardflow.job.jobfile import load_job  # noqa: E402
from shardflow.job.progress import Progress  # noqa: E402
from shardflow.shards.samples import read_samples  # noqa: E402
from shardflow.shards.writer import TarWriter  # noqa: E402

PER_SHARD = 12


# -- data --------------------------------------------------------------------------------------
def make_shards(directory: Path, count: int, per_shard: int = PER_SHARD) -> str:
    """`count` shards of `per_shard` small samples (txt + json); returns the brace spec."""
    directory.mkdir(parents=True, exist_ok=True)
    index = 0
    for shard in range(count):
        with TarWriter(str(directory / f"in-{shard:06d}.tar")) as writer:
            for _ in range(per_shard):
                writer.write({"__key__": f"s{index:05d}", "txt": f"sample {index}".encode(),
                              "json": json.dumps({"index": index}).encode()})
                index += 1
    return str(directory / f"in-{{000000..{count - 1:06d}}}.tar")


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])


def outputs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.tar"))


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in outputs(directory)}


def keys_in(directory: Path) -> list[str]:
    return sorted(s["__key__"] for p in outputs(directory) for s in read_samples(str(p)))


def temps(directory: Path) -> list[str]:
    return [p.name for p in directory.glob(".*.tmp-*")]


def done_markers(job) -> set[int]:
    return job.rundir().done_ids()


def expected_keys(count: int, per_shard: int = PER_SHARD) -> list[str]:
    return [f"s{i:05d}" for i in range(count * per_shard)]


# -- job functions (module level: the test cluster's workers import tests.backends.test_dask) ----------
def noisy(sample):
    """Deterministic randomness: the same bytes whichever backend or worker runs it."""
    rng = sf.sample_rng(sample)
    text = sample["txt"] + b" " + rng.bytes(8).hex().encode()
    return {"__key__": sample["__key__"], "txt": text, "json": sample["json"]}


def slow(sample):
    time.sleep(0.05)
    return {"__key__": sample["__key__"], "txt": sample["txt"]}


# ================================================================================================
def test_same_bytes_as_processes_and_rerun_does_no_work(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 6)
    by_processes = sf.ShardJob(noisy, spec, str(tmp_path / "p" / "{name}.tar"))
    assert by_processes.run("processes", workers=2, progress=False).ok
    job = sf.ShardJob(noisy, spec, str(tmp_path / "d" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok, str(report)
    assert (report.done, report.processed, report.stats.samples_out) == (6, 6 * PER_SHARD, 6 * PER_SHARD)
    assert len(digests(tmp_path / "d")) == 6
    assert digests(tmp_path / "d") == digests(tmp_path / "p")
    assert {s["url"].rsplit("/", 1)[-1]: s["sha256"] for s in report.shards} == digests(tmp_path / "d")

    mtimes = {p: p.stat().st_mtime_ns for p in outputs(tmp_path / "d")}
    again = job.run("dask", address=dask_cluster.address, progress=False)
    assert again.ok and again.skipped == 6 and again.processed == 0
    assert {p: p.stat().st_mtime_ns for p in outputs(tmp_path / "d")} == mtimes


def test_worker_killed_mid_task_runs_elsewhere_exactly_once(dask_cluster, dask_client, tmp_path, monkeypatch):
    shards = 8
    spec = make_shards(tmp_path / "in", shards, per_shard=16)
    out = tmp_path / "out"
    job = sf.ShardJob(slow, spec, str(out / "{name}.tar"))
    pids = dask_client.run(os.getpid)  # worker address -> pid (--no-nanny: the Popen's pid)
    killed: dict[str, object] = {}

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            busy = {w: keys for w, keys in dask_client.processing().items() if keys}
            if busy and temps(out):  # a task is running and writing its shard
                address, keys = sorted(busy.items())[0]
                proc = next(p for p in dask_cluster.worker_procs if p.pid == pids.get(address))
                killed.update(address=address, keys=list(keys))
                dask_cluster.kill_worker(proc)
                dask_cluster.start_worker(wait=False)  # a replacement, as an orchestrator would
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    report = job.run("dask", address=dask_cluster.address, progress=False)
    thread.join(5)
    assert killed.get("keys"), "the worker was never killed while running a task"
    assert report.ok, str(report)
    assert report.done == shards
    assert done_markers(job) == set(range(shards))
    assert keys_in(out) == expected_keys(shards, 16)  # every sample exactly once over all outputs
    assert len(outputs(out)) == shards and not temps(out)
    assert killed["address"] not in dask_client.scheduler_info()["workers"]


def test_truncated_shard_is_reported_not_retried(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 4)
    truncate(tmp_path / "in" / "in-000002.tar")
    log = tmp_path / "calls.log"

    def logged(sample, log=str(log)):
        with open(log, "a") as f:
            f.write(sample["__url__"].rsplit("/", 1)[-1] + "\n")
        return sample

    job = sf.ShardJob(logged, spec, str(tmp_path / "out" / "{name}.tar"))
    job.prepare()
    bar = Progress(4, 0, enabled=False)
    results = {r.task_id: r for r in execute_dask(job, job.plan(), bar, address=dask_cluster.address)}
    assert sorted(results) == [0, 1, 2, 3]
    bad = results[2]
    assert bad.status == "failed" and bad.kind == "input" and bad.attempts == 1
    assert "truncated" in bad.error and "in-000002.tar" in bad.error
    assert all(results[i].status == "done" for i in (0, 1, 3))
    assert job.rundir().failed_ids() == {2} and done_markers(job) == {0, 1, 3}
    calls = log.read_text().splitlines()
    # the bad shard was read once: its first samples reached fn once each, no second attempt
    assert 0 < calls.count("in-000002.tar") < PER_SHARD
    assert calls.count("in-000000.tar") == PER_SHARD

    report = job.run("dask", address=dask_cluster.address, progress=False)  # the whole run path too
    assert not report.ok and set(report.failed) == {2} and report.failed[2]["kind"] == "input"


def test_functions_from_test_scope_and_job_files_reach_workers(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 3)
    suffix = b"!closure"

    class Tagger:  # a class defined here: pickled by value with the function that uses it
        def __init__(self, tag):
            self.tag = tag

        def __call__(self, data):
            return data + self.tag

    tagger = Tagger(suffix)

    def local_fn(sample):
        return {"__key__": sample["__key__"], "txt": tagger(sample["txt"])}

    job = sf.ShardJob(local_fn, spec, str(tmp_path / "a" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok, str(report)
    texts = [s["txt"] for p in outputs(tmp_path / "a") for s in read_samples(str(p))]
    assert len(texts) == 3 * PER_SHARD and all(t.endswith(b"!closure") for t in texts)

    jobfile = tmp_path / "jobs" / "shout.py"  # a job file nobody can import by name
    jobfile.parent.mkdir()
    jobfile.write_text(textwrap.dedent('''
        """shout: upper-cases txt."""
        PARAMS = {"suffix": "?"}

        def helper(text):
            return text.upper() + PARAMS["suffix"].encode()

        def process(sample):
            return {"__key__": sample["__key__"], "txt": helper(sample["txt"])}
    '''))
    job = load_job(str(jobfile), inputs=spec, outputs=str(tmp_path / "b" / "{name}.tar"),
                   overrides={"suffix": "!!"})
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok, str(report)
    texts = [s["txt"] for p in outputs(tmp_path / "b") for s in read_samples(str(p))]
    assert texts[0] == b"SAMPLE 0!!" and len(texts) == 3 * PER_SHARD
    import cloudpickle

    assert job.fn.__module__ in cloudpickle.list_registry_pickle_by_value()  # still there for the next run

    # a module imported from a file by path (importlib), which no worker could import by name
    import importlib.util
    import sys

    path = tmp_path / "helpers" / "sf_path_loaded.py"
    path.parent.mkdir()
    path.write_text("def process(sample):\n    return {'__key__': sample['__key__'], 'txt': sample['txt'][::-1]}\n")
    module_spec = importlib.util.spec_from_file_location("sf_path_loaded", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["sf_path_loaded"] = module
    try:
        module_spec.loader.exec_module(module)
        job = sf.ShardJob(module.process, spec, str(tmp_path / "c" / "{name}.tar"))
        report = job.run("dask", address=dask_cluster.address, progress=False)
    finally:
        del sys.modules["sf_path_loaded"]
    assert report.ok, str(report)
    assert [s["txt"] for s in read_samples(str(outputs(tmp_path / "c")[0]))][0] == b"0 elpmas"


def test_missing_package_on_worker_gives_clear_error(dask_cluster, dask_client, tmp_path, monkeypatch):
    spec = make_shards(tmp_path / "in", 3)
    packages = tmp_path / "client_only_packages"  # on this process's sys.path, not the workers'
    for name in ("sf_client_only_dep", "sf_client_only_lazy"):
        (packages / name).mkdir(parents=True)
        (packages / name / "__init__.py").write_text("def tag(data):\n    return data + b'+'\n")
    monkeypatch.syspath_prepend(str(packages))
    import sf_client_only_dep  # noqa: PLC0415 - importable here only

    def uses_dep(sample):  # the module is a global of fn: unpickling on the worker imports it
        return {"__key__": sample["__key__"], "txt": sf_client_only_dep.tag(sample["txt"])}

    job = sf.ShardJob(uses_dep, spec, str(tmp_path / "a" / "{name}.tar"))
    assert job.run("serial", progress=False).ok  # fine where the package is installed
    job = sf.ShardJob(uses_dep, spec, str(tmp_path / "b" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert not report.ok and len(report.failed) == 1  # the run stops at the first such failure
    (failure,) = report.failed.values()
    assert failure["kind"] == "user"
    assert "cannot import 'sf_client_only_dep' needed by the job: install it in the worker image" in failure["error"]
    assert "worker tcp://127.0.0.1:" in failure["error"]
    assert "cannot import 'sf_client_only_dep'" in str(report)

    def imports_inside(sample):  # imported while the task runs: stops the task, not one sample
        import sf_client_only_lazy  # noqa: PLC0415

        return {"__key__": sample["__key__"], "txt": sf_client_only_lazy.tag(sample["txt"])}

    job = sf.ShardJob(imports_inside, spec, str(tmp_path / "c" / "{name}.tar"))
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert not report.ok
    (failure,) = report.failed.values()
    assert "cannot import 'sf_client_only_lazy' needed by the job" in failure["error"]
    assert failure["kind"] == "user"
    assert not temps(tmp_path / "c") and not outputs(tmp_path / "c")


def test_in_flight_tasks_are_bounded_and_progress_streams(dask_cluster, dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 30, per_shard=2)
    job = sf.ShardJob(noisy, spec, str(tmp_path / "out" / "{name}.tar"))
    job.prepare()
    seen: list[int] = []
    stop = threading.Event()

    def count_tasks(dask_scheduler):  # submitted and not finished yet
        return sum(1 for key, ts in dask_scheduler.tasks.items()
                   if "shardflow-noisy" in str(key) and ts.state not in ("memory", "released", "forgotten", "erred"))

    def watch() -> None:
        while not stop.is_set():
            seen.append(dask_client.run_on_scheduler(count_tasks))
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        results = list(execute_dask(job, job.plan(), Progress(30, 0, enabled=False), address=dask_cluster.address))
    finally:
        stop.set()
        thread.join(5)
    assert len(results) == 30 and all(r.status == "done" for r in results)
    assert max(seen) > 0
    assert max(seen) <= 3 * 2  # 3 x the cluster's 2 worker threads, never the whole plan

    # live sample counts arrive while a long task runs, not only when it ends
    spec = make_shards(tmp_path / "in2", 1, per_shard=20)
    job = sf.ShardJob(slow, spec, str(tmp_path / "out2" / "{name}.tar"))
    job.prepare()

    class Recording(Progress):
        def __init__(self):
            super().__init__(1, 0, enabled=False)
            self.calls: list[float] = []

        def add_samples(self, count):
            self.calls.append(time.monotonic())
            super().add_samples(count)

    bar = Recording()
    (result,) = list(execute_dask(job, job.plan(), bar, address=dask_cluster.address))
    finished = time.monotonic()
    assert result.status == "done" and result.stats.samples_in == 20
    assert bar.calls and min(bar.calls) < finished - 0.3  # counted mid-task (20 x 0.05 s task)


def test_stopping_the_run_stops_running_tasks(dask_cluster, dask_client, tmp_path, monkeypatch):
    spec = make_shards(tmp_path / "in", 4, per_shard=40)
    truncate(tmp_path / "in" / "in-000001.tar")
    out = tmp_path / "out"

    def slow_unless_bad(sample):
        if "in-000001" not in sample["__url__"]:
            time.sleep(0.1)  # a good task takes ~4 s
        return {"__key__": sample["__key__"], "txt": sample["txt"]}

    job = sf.ShardJob(slow_unless_bad, spec, str(out / "{name}.tar"), on_error="raise")
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert not report.ok and set(report.failed) == {1}
    done_at_return = done_markers(job)
    time.sleep(1.5)  # running tasks notice the cancellation within ~0.5 s and abort their shards
    assert not temps(out)
    assert not any(dask_client.processing().values())
    time.sleep(1.5)
    assert done_markers(job) == done_at_return and not outputs(out)


def test_scheduler_lost_ends_the_run_and_a_rerun_resumes(dask_cluster, tmp_path):
    spec = make_shards(tmp_path / "in", 6, per_shard=16)
    out = tmp_path / "out"
    job = sf.ShardJob(slow, spec, str(out / "{name}.tar"))
    doomed = type(dask_cluster)(tmp_path / "doomed", dask_cluster.dask)  # a cluster of its own to lose
    try:
        doomed.start_scheduler()
        doomed.ensure_workers(2)

        def kill_scheduler() -> None:
            deadline = time.monotonic() + 60
            while not (out / "_shardflow" / "done").is_dir() or not os.listdir(out / "_shardflow" / "done"):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
            os.kill(doomed.scheduler_proc.pid, 9)

        thread = threading.Thread(target=kill_scheduler, daemon=True)
        thread.start()
        started = time.monotonic()
        with pytest.raises(JobError) as info:
            job.run("dask", address=doomed.address, progress=False)
        assert time.monotonic() - started < 30
        message = str(info.value)
        assert f"lost the Dask scheduler at {doomed.address}" in message and "rerun to resume" in message
        assert str(out / "_shardflow") in message
    finally:
        doomed.close()
    finished_before = done_markers(job)
    assert 0 < len(finished_before) < 6
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok, str(report)
    assert report.skipped >= len(finished_before) and report.processed <= (6 - len(finished_before)) * 16
    assert keys_in(out) == expected_keys(6, 16) and not temps(out)


@pytest.mark.cluster
def test_local_cluster_and_a_task_that_keeps_killing_workers(tmp_path, capfd):
    import dask

    spec = make_shards(tmp_path / "in", 4)

    def poison(sample):  # SIGKILLs whichever worker process runs shard 2
        if "in-000002" in sample["__url__"]:
            os.kill(os.getpid(), 9)
        return sample

    job = sf.ShardJob(poison, spec, str(tmp_path / "out" / "{name}.tar"))
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        report = job.run("dask", workers=2, dashboard_address=":0", progress=False)  # a LocalCluster
    assert set(report.failed) == {2}, str(report)
    assert report.failed[2]["kind"] == "io" and "died 2 times" in report.failed[2]["error"]
    assert report.done == 3 and done_markers(job) == {0, 1, 3} and job.rundir().failed_ids() == {2}
    assert keys_in(tmp_path / "out") == [k for k in expected_keys(4) if not (24 <= int(k[1:]) < 36)]
    assert "Dask dashboard" in capfd.readouterr().err


def test_address_and_client_are_exclusive_and_bad_address_is_clear(dask_client, tmp_path):
    spec = make_shards(tmp_path / "in", 1)
    job = sf.ShardJob(noisy, spec, str(tmp_path / "out" / "{name}.tar"))
    with pytest.raises(JobError, match="address or a client"):
        job.run("dask", address="tcp://127.0.0.1:1", client=dask_client, progress=False)
    with pytest.raises(JobError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:1"):
        job.run("dask", address="tcp://127.0.0.1:1", connect_timeout=2, progress=False)
    report = job.run("dask", client=dask_client, progress=False)  # a caller's client stays open
    assert report.ok and dask_client.status == "running"


def test_cli_run_with_backend_dask(dask_cluster, dask_client, tmp_path):
    import subprocess
    import sys

    spec = make_shards(tmp_path / "in", 2)
    jobfile = tmp_path / "upper.py"
    jobfile.write_text("def process(sample):\n"
                       "    return {'__key__': sample['__key__'], 'txt': sample['txt'].upper()}\n")
    command = [sys.executable, "-m", "shardflow.cli", "run", str(jobfile), "--backend", "dask",
               "--address", dask_cluster.address, "--inputs", spec, "--outputs", str(tmp_path / "out" / "{name}.tar"),
               "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2/2 tasks done" in done.stdout
    assert keys_in(tmp_path / "out") == expected_keys(2)
    assert [s["txt"] for s in read_samples(str(outputs(tmp_path / "out")[0]))][0] == b"SAMPLE 0"
