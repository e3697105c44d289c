"""Scale paths of one task and of the run directory (issue 16): temps found by name, never by a
directory listing; run-dir cleanup limited to shardflow's own temps; one listing per folder; per-chunk
summaries read instead of one marker per task; the Argo fan-out cap."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from shardflow.cluster import worker
from shardflow.cluster.manifests.argo import workflow_manifest
from shardflow.cluster.manifests.common import ClusterOptions
from shardflow.errors import ShardIOError
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.listing import TEMP_TAG
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.status import read_status
from shardflow.shards.task_files import remove_stale_temps
from shardflow.shards.writer import TarWriter
from shardflow.storage.atomic import is_own_temp, temp_name
from shardflow.storage.publish import open_atomic
from tests.support.jobs import make_shards, spec


def identity(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def _job(tmp: Path, shards: int, **kw) -> ShardJob:
    make_shards(tmp / "in", shards, 2)
    return ShardJob(identity, spec(tmp / "in", "in", shards), f"{tmp}/out/{{name}}.tar", **kw)


def _no_listing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the output directory was listed")

    for name in ("scandir", "listdir"):
        monkeypatch.setattr(os, name, refuse)


# -- A: a task's stale temps, by name --------------------------------------------------------------
def test_stale_temps_of_a_task_are_found_by_name_without_listing_the_directory(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for i in range(300):  # a crowded output directory: other tasks' shards and a temp of another task
        (out / f"other-{i:04d}.tar").write_bytes(b"x")
    (out / temp_name("other-0000.tar", "t9")).write_bytes(b"another task's temp")
    (out / ".notes.tmp-journal").write_bytes(b"another program's temp")

    def part(index: int) -> str:
        return str(out / ("a.tar" if index == 0 else f"a_{index:03d}.tar"))

    for index in range(3):  # a killed attempt that rolled over twice: parts 0, 1 published, part 2 open
        w = TarWriter(part(index), temp_tag="t1")
        w.write({"__key__": f"k{index}", "txt": b"x"})
        w._sink.flush()
        if index < 2:
            w.close()
    w2_temp = Path(temp_name(part(2), "t1"))
    assert w2_temp.exists()
    os.replace(part(1), temp_name(part(1), "t1"))  # part 1's commit was cut off before its rename
    with monkeypatch.context() as m:
        _no_listing(m)
        assert remove_stale_temps(part, tag="t1") == 2
    left = sorted(p.name for p in out.iterdir())
    assert ".notes.tmp-journal" in left and temp_name("other-0000.tar", "t9") in left
    assert not [n for n in left if n.endswith(".tmp-t1")]
    w.abort()


def test_object_stores_get_no_request_for_temps():
    unreachable = {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"}  # any request would fail
    assert remove_stale_temps(lambda i: "s3://bucket/out/a.tar" if i == 0 else "", unreachable, tag="t") == 0


def test_a_twin_attempt_never_publishes_the_other_attempts_bytes(tmp_path):
    url = str(tmp_path / "a.tar")
    first = open_atomic(url, tag="t3")
    first.write(b"first attempt, slow")
    second = open_atomic(url, tag="t3")  # the same task started again elsewhere: takes the temp name over
    second.write(b"second attempt")
    second.commit()
    with pytest.raises(ShardIOError, match="another attempt"):
        first.commit()
    assert Path(url).read_bytes() == b"second attempt"
    assert [p.name for p in tmp_path.iterdir()] == ["a.tar"]


# -- issue 12 item 10: the run directory's own temps only --------------------------------------------
def test_prepare_removes_only_shardflows_own_temps_in_its_own_folders(tmp_path):
    run_dir = tmp_path / "rd"
    (run_dir / "done").mkdir(parents=True)
    (run_dir / "mine" / "sub").mkdir(parents=True)
    others = [run_dir / ".db.tmp-journal", run_dir / ".x.tmp-0123456789ab", run_dir / "done" / ".a.tmp-zz",
              run_dir / "mine" / "sub" / f".plan.json.tmp-{TEMP_TAG}-0123456789ab"]
    for path in others:
        path.write_bytes(b"not shardflow's")
    own = [run_dir / f".plan.json.tmp-{TEMP_TAG}-0123456789ab",
           run_dir / "done" / f".000001.json.tmp-{TEMP_TAG}-abcdef012345"]
    for path in own:
        path.write_bytes(b"{")
    job = _job(tmp_path, 2, run_dir=str(run_dir))
    job.prepare()
    assert all(p.exists() for p in others)
    assert not any(p.exists() for p in own)
    assert is_own_temp(own[0].name, TEMP_TAG) and not is_own_temp(".db.tmp-journal", TEMP_TAG)


# -- B: listings and summaries ----------------------------------------------------------------------
def test_reports_and_status_read_chunk_summaries_not_markers(tmp_path):
    job = _job(tmp_path, 5)
    report = job.run("serial", progress=False)
    assert report.ok
    rd = Path(job.run_dir)
    assert sorted(p.name for p in (rd / "summaries").iterdir()) == ["000000000-000000005.json"]
    for marker in (rd / "done").iterdir():  # markers unreadable: status and a no-op rerun use the summary
        marker.write_bytes(b"not json")
    status = read_status(job.run_dir)
    assert status.complete and status.stats.samples_in == 10 and status.shards == 5
    again = _job(tmp_path, 5).run("serial", progress=False)
    assert again.ok and again.stats.samples_in == 10 and [s["url"] for s in again.shards] == \
        [s["url"] for s in report.shards]


def test_a_pod_writes_the_summary_of_its_chunk(tmp_path):
    job = _job(tmp_path, 5)
    job.prepare()
    code = worker.run_chunk(job.run_dir, 1, 2, out=io.StringIO(), err=io.StringIO())
    assert code == 0
    assert [p.name for p in (Path(job.run_dir) / "summaries").iterdir()] == ["000000002-000000004.json"]
    block = json.loads((Path(job.run_dir) / "summaries" / "000000002-000000004.json").read_text())
    assert block["stats"]["samples_in"] == 4 and len(block["shards"]) == 2
    for index in (0, 2):
        assert worker.run_chunk(job.run_dir, index, 2, out=io.StringIO(), err=io.StringIO()) == 0
    report = worker.write_summary(RunDir(job.run_dir))
    assert report.ok and report.stats.samples_in == 10 and len(report.shards) == 5


def test_done_ids_leave_no_listing_in_the_s3_cache(s3_server, s3_bucket):
    url = f"{s3_bucket}/rd"
    rd = RunDir(url, s3_server.storage_options)
    for task in range(3):
        rd.mark_done(task, {"task": task, "outputs": [], "stats": {}})
    assert rd.done_ids() == {0, 1, 2}
    assert not [k for k in rd.fs.dircache if k.rstrip("/").endswith("rd/done")]
    rd.mark_done(3, {"task": 3, "outputs": [], "stats": {}})  # a listing cached before would hide this one
    assert rd.done_ids() == {0, 1, 2, 3}


# -- D: Argo fan-out --------------------------------------------------------------------------------
@pytest.mark.parametrize("per", [None, 1, 7, 499])
def test_argo_fan_out_is_capped_at_a_million_tasks_whatever_tasks_per_pod_says(per):
    opts = ClusterOptions(image="img:1", run_dir="s3://b/rd", tasks=1_000_000, tasks_per_pod=per)
    steps = workflow_manifest(opts)["spec"]["templates"][0]["steps"]
    count = int(steps[0][0]["withSequence"]["count"])
    assert count <= 2_000 and count * opts.per_pod("argo") >= 1_000_000
    if per is None or per >= 10:
        assert opts.per_pod("kubernetes") == (per or 100)  # a Kubernetes Job keeps what it is given


def test_a_task_done_on_s3_deletes_no_record_that_is_not_there(s3_server, s3_bucket):
    rd = RunDir(f"{s3_bucket}/rd", s3_server.storage_options)
    rd.fs.connect()
    deletes: list[str] = []
    rd.fs.s3.meta.events.register("before-send.s3", lambda request=None, **_: deletes.append(request.url)
                                  if request.method in ("DELETE", "POST") else None)
    rd.write_errors(0, [])
    rd.mark_done(0, {"task": 0, "outputs": [], "stats": {}})
    assert deletes == []  # 0.1.0: two DELETEs (failed/000000.json, errors/000000.jsonl) per task
    RunDir(f"{s3_bucket}/rd", s3_server.storage_options).mark_failed(1, {"task": 1, "error": "x"})  # elsewhere
    retry = RunDir(f"{s3_bucket}/rd", s3_server.storage_options)  # the retry, in another process
    retry.write_errors(1, [{"key": "a"}])
    retry.write_errors(1, [])
    retry.mark_done(1, {"task": 1, "outputs": [], "stats": {}})
    assert retry.failed_ids() == set() and retry.list_names("errors") == []


def test_done_ids_come_from_the_summaries_when_they_cover_the_plan(tmp_path):
    job = _job(tmp_path, 3)
    assert job.run("serial", progress=False).ok
    rd = RunDir(job.run_dir)
    (Path(job.run_dir) / "done" / "000001.json").unlink()  # not listed: the summary's name says it all
    assert rd.done_ids() == {0, 1, 2}
    (Path(job.run_dir) / "summaries" / "000000000-000000003.json").unlink()
    assert rd.done_ids() == {0, 2}


def test_the_argo_finalize_step_gets_memory_for_its_task_count():
    def finalize_memory(tasks: int, memory: str = "2Gi") -> str:
        opts = ClusterOptions(image="img:1", run_dir="s3://b/rd", tasks=tasks, memory=memory)
        templates = {t["name"]: t for t in workflow_manifest(opts)["spec"]["templates"]}
        assert templates["chunk"]["container"]["resources"]["limits"]["memory"] == memory  # pods keep theirs
        resources = templates["finalize"]["container"]["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]
        return resources["limits"]["memory"]

    assert finalize_memory(1_000) == "2Gi"
    assert finalize_memory(1_000_000) == "2Gi"  # 314 MB measured at 1M (bench/README.md, issue 28 round 5)
    assert finalize_memory(1_000_000, "1Gi") == "2Gi"  # 512 MiB + 1 KiB a task
    assert finalize_memory(4_000_000) == "5Gi"
    assert finalize_memory(1_000_000, "8Gi") == "8Gi"
    assert finalize_memory(5_000_000, "weird") == "weird"
