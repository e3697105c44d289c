"""A run directory written by shardflow 0.1.0 still resumes with this release.

tests/fixtures/release_0_1_0/ holds what 0.1.0 wrote for the job file `flip.py` there (2 tasks,
task 0 finished): `_shardflow/plan.json`, `_shardflow/job.pkl` (it pickles `shardflow.job.ShardJob`
and `shardflow.codecs.Decoder`/`Encoder` by reference) and `done/000000.json`; `expected.json` holds
the receipts 0.1.0 wrote when it ran task 1. The inputs are regenerated (demo data is deterministic).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cloudpickle

from shardflow.cluster import worker
from shardflow.rundir.status import read_status
from shardflow.tools.demo import write_synthetic_shards

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "release_0_1_0"


def _setup(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)  # the 0.1.0 plan names relative paths: in/..., out/...
    write_synthetic_shards("in", shards=2, samples_per_shard=4, size=(32, 24), seed=1, distinct=4)
    shutil.copytree(FIXTURE / "_shardflow", tmp_path / "out" / "_shardflow")
    return "out/_shardflow"


def test_job_pickled_by_0_1_0_loads_into_the_new_classes():
    job = cloudpickle.loads((FIXTURE / "_shardflow" / "job.pkl").read_bytes())
    from shardflow import ShardJob
    from shardflow.codecs import Decoder, Encoder

    assert isinstance(job, ShardJob) and job.name == "flip" and job.seed == 7 and job.maxcount == 3
    assert isinstance(job._decoder, Decoder) and isinstance(job._encoder, Encoder)
    context = job.task_context()
    assert context.decoder is job._decoder and context.spec.seed == 7


def test_run_dir_of_0_1_0_resumes_with_identical_bytes(tmp_path, monkeypatch):
    run_dir = _setup(tmp_path, monkeypatch)
    before = read_status(run_dir)
    assert before.done == [0] and before.pending == [1]

    code = worker.run_chunk(run_dir, 1, 1)

    assert code == worker.EXIT_OK
    marker = json.loads((tmp_path / "out" / "_shardflow" / "done" / "000001.json").read_text())
    expected = json.loads((FIXTURE / "expected.json").read_text())["task_1_outputs"]
    assert marker["outputs"] == expected  # same names, counts, sizes and sha256 as 0.1.0 wrote
    for receipt in expected:
        assert (tmp_path / receipt["url"]).stat().st_size == receipt["nbytes"]
    after = read_status(run_dir)
    assert after.complete and after.done == [0, 1]
    assert worker.run_chunk(run_dir, 0, 1) == worker.EXIT_OK  # task 0: done by 0.1.0, skipped
    assert not (tmp_path / "out" / "train-000000-00.tar").exists()
