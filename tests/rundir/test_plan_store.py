"""The plan layout at scale (issue 16): a compact task table in plan.json, chunk files when names
follow no numbering, tasks read per chunk, the 0.1.0 fingerprint kept."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.errors import JobError
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.plan_store import plan_fingerprint
from shardflow.rundir.plan_table import Column, TaskTable, compress
from shardflow.rundir.run_dir import RunDir
from shardflow.storage.specs import count, expand


def identity(sample):
    return sample


@given(st.lists(st.one_of(
    st.builds(lambda a, n, w: [f"s3://b/x-{a + i:0{w}d}.tar" for i in range(n)],
              st.integers(0, 120), st.integers(1, 30), st.integers(1, 4)),
    st.lists(st.text("ab09-./", max_size=8), max_size=5),
)).map(lambda parts: [name for part in parts for name in part]))
@settings(max_examples=200, deadline=None)
def test_compressed_columns_give_back_every_name(names):
    column = Column(compress(names))
    assert len(column) == len(names)
    assert [column[i] for i in range(len(names))] == names


# The outputs below are on an S3 bucket that no server holds: prepare(overwrite=True) skips the one guard that
# lists the output folder (job.guard.check_foreign_shards, tested in test_safe_outputs.py).


def test_a_brace_range_is_one_run_per_column_and_carries_past_its_width():
    names = [f"in-{i}.tar" for i in range(95, 1005)]  # 95..99, 100..999, 1000..1004: widths change
    runs = compress(names)
    assert len(runs) == 1 and runs[0]["n"] == len(names)


def test_many_tasks_make_a_small_plan_and_a_pod_reads_only_its_tasks(tmp_path):
    spec = "s3://bucket/train/shard-{000000..019999}.tar"  # bench/scale.py: 100k and 1M
    job = ShardJob(identity, spec, "s3://bucket/out/{name}.tar", run_dir=str(tmp_path / "rd"), maxcount=10)
    job.prepare(overwrite=True)  # no S3 server here: skip listing the output folder for foreign shards
    plan_file = tmp_path / "rd" / "plan.json"
    assert plan_file.stat().st_size < 2_000  # 0.1.0: ~220 bytes per task (4.4 MB here, 220 MB at 1M)
    assert not (tmp_path / "rd" / "plan").exists()
    rd = RunDir(str(tmp_path / "rd"))
    plan = rd.load_plan()
    assert rd.task_count(plan) == 20_000
    started = time.perf_counter()
    mine = list(rd.load_tasks(plan, range(19_990, 20_000)))
    assert time.perf_counter() - started < 0.1
    assert mine == job.plan()[19_990:]
    assert plan["fingerprint"] == plan_fingerprint([t.to_json() for t in job.plan()], job.settings())


def test_names_that_follow_no_numbering_go_to_chunk_files(tmp_path):
    names = [f"memory://in/{hashlib.sha256(str(i).encode()).hexdigest()[:10]}.tar" for i in range(2_500)]
    job = ShardJob(identity, names, "memory://out/{name}.tar", run_dir=str(tmp_path / "rd"), inputs_per_task=2)
    job.prepare(overwrite=True)
    stored = json.loads((tmp_path / "rd" / "plan.json").read_text())
    assert stored["table"] is None and stored["task_count"] == 1_250
    assert sorted(p.name for p in (tmp_path / "rd" / "plan").iterdir()) == ["chunk-000000.json", "chunk-000001.json"]
    rd = RunDir(str(tmp_path / "rd"))
    assert list(rd.load_tasks(rd.load_plan(), range(995, 1_010))) == job.plan()[995:1_010]


def test_the_fingerprint_is_0_1_0s_digest_hashed_task_by_task():
    tasks = [{"id": i, "inputs": [f"a{i}"], "output": f"o{i}", "output_parts": f"o{i}_{{part}}"} for i in range(5)]
    setting = {"seed": 1, "encode": {"q": 2}}
    text = json.dumps({"tasks": tasks, "settings": setting}, sort_keys=True, separators=(",", ":"))
    assert plan_fingerprint(tasks, setting) == hashlib.sha256(text.encode()).hexdigest()
    bare = json.dumps(tasks, sort_keys=True, separators=(",", ":"))
    assert plan_fingerprint(tasks) == hashlib.sha256(bare.encode()).hexdigest()


def test_a_different_plan_is_still_refused_with_what_differs(tmp_path):
    rd = str(tmp_path / "rd")
    ShardJob(identity, "s3://b/in-{0000..0099}.tar", "s3://b/out/{name}.tar", run_dir=rd).prepare(overwrite=True)
    with pytest.raises(JobError, match="task 7 differs"):
        names = [f"s3://b/in-{i:04d}.tar" if i != 7 else "s3://b/other.tar" for i in range(100)]
        ShardJob(identity, names, "s3://b/out/{name}.tar", run_dir=rd).prepare(overwrite=True)
    same = ShardJob(identity, "s3://b/in-{0000..0099}.tar", "s3://b/out/{name}.tar", run_dir=rd)
    same.prepare(overwrite=True)  # the same plan: fine


def test_table_refuses_tasks_out_of_plan_order():
    with pytest.raises(ValueError):
        TaskTable.encode([{"id": 1, "inputs": ["a"], "output": "o", "output_parts": "p"}])


def test_old_plan_json_with_every_task_is_still_read(tmp_path):
    rd = RunDir(str(tmp_path))
    tasks = [{"id": i, "inputs": [f"in/{i}.tar"], "output": f"out/{i}.tar", "output_parts": f"out/{i}_{{part:03d}}.tar"}
             for i in range(3)]
    rd.write_json("plan.json", {"version": 1, "tasks": tasks, "fingerprint": "x"})
    plan = rd.load_plan()
    assert rd.task_count(plan) == 3
    assert [t.to_json() for t in rd.load_tasks(plan, [1, 2])] == tasks[1:]
    assert Path(tmp_path / "plan.json").exists()


def test_manifests_for_a_million_tasks_count_them_without_building_them():
    job = ShardJob(identity, "s3://b/in-{0000000..0999999}.tar", "s3://b/out/{name}.tar", run_dir="s3://b/rd")
    started = time.perf_counter()
    argo = yaml.safe_load(job.to_argo("img:1", prepare=False))
    k8s = yaml.safe_load(job.to_kubernetes("img:1", prepare=False))
    assert time.perf_counter() - started < 10  # 0.1.0: 25 s and 650 MB (a million Task objects)
    assert job._tasks is None
    assert argo["spec"]["templates"][0]["steps"][0][0]["withSequence"]["count"] == "2000"
    assert k8s["spec"]["completions"] == 10_000


@pytest.mark.parametrize("spec", ["a-{0..9}.tar", "x-{000000..000554}.tar", "a-{0..9}-{1..3}.tar", "a-{10..0..3}.tar",
                                  "a{1,2}{0..3}.tar", "plain.tar", ["a-{0..2}.tar", "b.tar"], "a-{0..2}/{x,y}.tar",
                                  "-", "a-{-2..2}.tar", r"a\{0..3\}.tar", "a-{0..1}.tar::b-{0..2}.tar",
                                  "${SF_TEST_DIR}/x-{0..3}.tar"])
def test_counting_a_spec_agrees_with_expanding_it(spec, monkeypatch):
    monkeypatch.setenv("SF_TEST_DIR", "d")
    assert count(spec) == len(expand(spec))


@pytest.mark.parametrize("inputs,outputs,per", [
    ("s3://b/in-{0000..2499}.tar", "s3://b/out/{name}.tar", 1),
    ("s3://b/in-{0000..2499}.tar", "s3://b/out/p-{task:05d}-{part:03d}.tar", 3),
    ("s3://b/in-{00..39}-{0..9}.tar", "s3://b/out/{task}.tgz", 7),
    pytest.param("s3://b/in-{0..999}-{0..99}.tar", "s3://b/out/{task}.tar", 1,  # a table over 64 KB: chunk files
                 marks=pytest.mark.slow),
])
def test_prepare_makes_the_table_from_the_specs_exactly_as_from_the_tasks(tmp_path, inputs, outputs, per):
    lazy = ShardJob(identity, inputs, outputs, run_dir=str(tmp_path / "lazy"), inputs_per_task=per)
    lazy.prepare(overwrite=True)
    assert lazy._tasks is None  # no Task object was built
    built = ShardJob(identity, inputs, outputs, run_dir=str(tmp_path / "built"), inputs_per_task=per)
    built.plan()
    built.prepare(overwrite=True)
    a, b = (json.loads((tmp_path / d / "plan.json").read_text()) for d in ("lazy", "built"))
    assert a == b  # same table (or chunk files), same fingerprint
    rd = RunDir(str(tmp_path / "lazy"))
    assert list(rd.load_tasks(a, range(a["task_count"]))) == built.plan()
    # each accepts the other's plan
    assert built.prepare(overwrite=True) is not None and lazy.prepare(overwrite=True) is not None


def test_outputs_that_could_repeat_go_through_the_plan_and_its_duplicate_check(tmp_path):
    job = ShardJob(identity, "s3://b/in-{0..9}.tar", "s3://b/out/x{task:1d}.tar", run_dir=str(tmp_path / "rd"))
    job.prepare(overwrite=True)  # x0..x9: one run, distinct
    clash = ShardJob(identity, "s3://b/a-{0..3}.tar", "s3://b/out/{name}.tar", run_dir=str(tmp_path / "rd2"),
                     inputs_per_task=1)
    clash.prepare(overwrite=True)
    with pytest.raises(JobError, match="same name"):
        ShardJob(identity, ["s3://b/a/x.tar", "s3://b/b/x.tar"], "s3://b/out/{name}.tar",
                 run_dir=str(tmp_path / "rd3")).prepare(overwrite=True)
