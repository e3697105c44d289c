"""job.json beside job.pkl: pods check the versions before unpickling, and rebuild job-file jobs from source."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import cloudpickle

import shardflow
from shardflow.cluster import contract, worker
from shardflow.job.jobfile import load_job
from shardflow.job.jobrecord import version_mismatch
from shardflow.job.shard_job import ShardJob
from tests.support.k8s import input_keys, make_shards, output_keys, write_job_file


def identity(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def run(url: str, index: int = 0, per: int = 1) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = worker.run_chunk(url, index, per, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _edit_record(run_dir: Path, **versions: str) -> dict:
    record = json.loads((run_dir / "job.json").read_text())
    record["versions"].update(versions)
    (run_dir / "job.json").write_text(json.dumps(record))
    return record


def test_versions_are_recorded_beside_the_pickle(tmp_path):
    make_shards(tmp_path / "in", 1, 2)
    job = ShardJob(identity, str(tmp_path / "in" / "in-000000.tar"), f"{tmp_path}/out/{{name}}.tar")
    job.prepare()
    record = json.loads((Path(job.run_dir) / "job.json").read_text())
    assert record["versions"] == {"python": ".".join(map(str, sys.version_info[:3])),
                                  "shardflow": shardflow.__version__, "cloudpickle": cloudpickle.__version__}
    assert record["job_file"] is None  # a function of a module: only the pickle can carry it


def test_pickle_from_another_python_exits_78_naming_both_versions(tmp_path):
    make_shards(tmp_path / "in", 1, 2)
    job = ShardJob(identity, str(tmp_path / "in" / "in-000000.tar"), f"{tmp_path}/out/{{name}}.tar")
    job.prepare()
    run_dir = Path(job.run_dir)
    here = ".".join(map(str, sys.version_info[:2]))
    _edit_record(run_dir, python="3.99.1")
    # what a 3.99 pickle does to this interpreter is unknowable; the worker must not even try
    (run_dir / "job.pkl").write_bytes(b"\x80\x05 would crash or worse")
    code, _, err = run(job.run_dir)
    assert code == contract.EXIT_STOP == 78
    assert "python 3.99.1 wrote it" in err and f"this image has python {here}" in err
    assert "cannot load the job" not in err  # refused before unpickling
    assert not (tmp_path / "out" / "in-000000.tar").exists()


def test_other_cloudpickle_or_shardflow_is_refused_same_patch_python_is_not():
    here = {"python": "3.11.9", "shardflow": "0.2.0", "cloudpickle": "3.1.1"}
    assert version_mismatch({"python": "3.11.4", "shardflow": "0.2.0", "cloudpickle": "3.1.1"}, here) is None
    why = version_mismatch({"python": "3.12.1", "shardflow": "0.1.0", "cloudpickle": "3.0.0"}, here)
    assert "python 3.12.1 wrote it, this image has python 3.11.9" in why
    assert "cloudpickle 3.0.0" in why and "shardflow 0.1.0" in why
    assert version_mismatch({}, here) is None  # nothing recorded: nothing to compare


def test_job_file_job_is_rebuilt_from_source_whatever_wrote_the_pickle(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    path = write_job_file(tmp_path)
    job = load_job(path, inputs=str(tmp_path / "in" / "in-{000000..000001}.tar"),
                   outputs=f"{tmp_path}/out/{{name}}.tar", overrides={"sleep": 0.001})
    job.prepare()
    run_dir = Path(job.run_dir)
    record = _edit_record(run_dir, python="3.99.1", cloudpickle="0.0.1")
    assert record["job_file"]["name"] == "identity.py"
    assert record["job_file"]["settings"]["params"] == {"sleep": 0.001}
    (run_dir / "job.pkl").write_bytes(b"never read")  # the pickle is not used at all
    path.unlink()  # nor the submitter's file: the source travels in job.json
    code, log, err = run(job.run_dir, 0, 2)
    assert code == 0, err
    assert output_keys(tmp_path / "out") == input_keys(2, 3)


def test_job_file_that_does_not_load_in_the_image_exits_78(tmp_path):
    make_shards(tmp_path / "in", 1, 2)
    path = tmp_path / "needs.py"
    path.write_text("def process(sample):\n    return sample\n")
    job = load_job(path, inputs=str(tmp_path / "in" / "in-000000.tar"), outputs=f"{tmp_path}/out/{{name}}.tar")
    job.prepare()
    record_path = Path(job.run_dir) / "job.json"
    record = json.loads(record_path.read_text())
    record["job_file"]["source"] = "import module_not_in_this_image_at_all\n" + record["job_file"]["source"]
    record_path.write_text(json.dumps(record))
    code, _, err = run(job.run_dir)
    assert code == 78
    assert "cannot rebuild the job" in err and "module_not_in_this_image_at_all" in err
