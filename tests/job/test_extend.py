"""--extend (extend=True): a run directory's plan grows by the inputs that are new since it was planned.

Before it, a rerun over a grown input folder was refused ("holds a different plan (2 tasks there, 3
now)") and the only ways out recomputed everything (--redo) or split the run in two run directories."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardflow as sf
from shardflow.cli import main
from shardflow.errors import JobError
from shardflow.rundir.plan_store import PLAN_CHUNK
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, write_job


def copy(sample):
    return sample


def copy_too(sample):
    return dict(sample)


def shards(folder: Path, names: list[str], per: int = 2) -> None:
    """One tar per name with `per` samples keyed `<name>-<i>`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tarfile.open(folder / f"{name}.tar", "w") as tf:
            for i in range(per):
                info = tarfile.TarInfo(f"{name}-{i}.txt")
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))


def keys(folder: Path) -> Counter:
    return Counter(s["__key__"] for p in sorted(folder.glob("*.tar")) for s in read_samples(str(p)))


def job_at(tmp_path: Path, fn=copy, **kw) -> sf.ShardJob:
    settings = dict(inputs=str(tmp_path / "in" / "*.tar"), outputs=str(tmp_path / "out" / "{name}.tar"),
                    run_dir=str(tmp_path / "run"))
    return sf.ShardJob(fn, **{**settings, **kw})


def stored_tasks(run_dir: RunDir) -> list[dict]:
    plan = run_dir.load_plan()
    return [t.to_json() for t in run_dir.load_tasks(plan, range(run_dir.task_count(plan)))]


def test_extend_runs_only_the_new_shard_and_leaves_the_old_outputs_alone(tmp_path):
    shards(tmp_path / "in", ["a", "b"])
    assert job_at(tmp_path).run("serial", progress=False).ok
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "out").glob("*.tar")}
    old_tasks = stored_tasks(RunDir(str(tmp_path / "run")))
    shards(tmp_path / "in", ["c"])
    with pytest.raises(JobError, match=r"2 tasks there, 3 now.*--extend"):  # a plain rerun says the way
        job_at(tmp_path).run("serial", progress=False)
    run_dir = job_at(tmp_path).prepare(extend=True)
    assert run_dir.done_ids() == {0, 1}  # the summary of [0, 2) does not make task 2 done
    report = job_at(tmp_path).run("serial", progress=False, extend=True)
    assert (report.tasks, report.done, report.skipped, report.processed) == (3, 3, 2, 2)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "out").glob("*.tar")
            if p.name != "c.tar"} == before
    assert stored_tasks(run_dir)[:2] == old_tasks
    assert Path(stored_tasks(run_dir)[2]["inputs"][0]).name == "c.tar"
    assert keys(tmp_path / "out") == Counter({f"{n}-{i}": 1 for n in "abc" for i in range(2)})
    assert run_dir.done_ids() == {0, 1, 2}
    status = CliRunner().invoke(main, ["status", str(tmp_path / "run")])
    assert "3 in the plan, 3 done, 0 failed, 0 pending" in status.output, status.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"] == 3


def test_extend_with_nothing_new_is_a_plain_resume(tmp_path):
    shards(tmp_path / "in", ["a", "b"])
    assert job_at(tmp_path).run("serial", progress=False, extend=True).ok  # nothing stored yet: a first run
    plan = (tmp_path / "run" / "plan.json").read_bytes()
    job = job_at(tmp_path)
    report = job.run("serial", progress=False, extend=True)
    assert (report.tasks, report.skipped, report.processed) == (2, 2, 0)
    assert (tmp_path / "run" / "plan.json").read_bytes() == plan
    assert report.notes == ["--extend: no new inputs; resuming the stored plan of 2 tasks"]
    assert str(report).startswith("--extend: no new inputs")  # the report says it first


def test_extend_refuses_a_stored_input_that_is_gone(tmp_path):
    shards(tmp_path / "in", ["a", "b"])
    job_at(tmp_path).prepare()
    (tmp_path / "in" / "a.tar").unlink()
    shards(tmp_path / "in", ["c"])
    with pytest.raises(JobError, match=r"--extend only adds inputs: 1 input of the plan .* is not among the inputs "
                                       r"any more \(e\.g\. .*a\.tar\)"):
        job_at(tmp_path).prepare(extend=True)
    assert len(stored_tasks(RunDir(str(tmp_path / "run")))) == 2


def test_extend_refuses_other_settings_and_other_code_unless_resumed_anyway(tmp_path):
    shards(tmp_path / "in", ["a"])
    job_at(tmp_path).prepare()
    shards(tmp_path / "in", ["b"])
    with pytest.raises(JobError, match=r"settings differ \(seed\).*--redo"):
        job_at(tmp_path, seed=7).prepare(extend=True)
    with pytest.raises(JobError, match="code differs.*--resume-anyway"):
        job_at(tmp_path, fn=copy_too).prepare(extend=True)
    assert len(stored_tasks(RunDir(str(tmp_path / "run")))) == 1  # refused before anything was written
    assert job_at(tmp_path, fn=copy_too).run("serial", progress=False, extend=True, resume_anyway=True).done == 2
    with pytest.raises(JobError, match="pass one of them"):
        job_at(tmp_path).prepare(extend=True, redo=True)


def test_extend_and_redo_is_a_usage_error(tmp_path):
    shards(tmp_path / "in", ["a"])
    result = CliRunner().invoke(main, ["run", "reshard", "-i", str(tmp_path / "in" / "*.tar"), "-o",
                                       str(tmp_path / "out" / "{name}.tar"), "--extend", "--redo"])
    assert result.exit_code == 2
    assert "(--extend) adds tasks to the stored plan and redo=True (--redo) starts over" in result.output
    assert not (tmp_path / "out").exists()


def test_the_cli_says_what_extend_added(tmp_path):
    shards(tmp_path / "in", ["a", "b"])
    args = ["run", "reshard", "-i", str(tmp_path / "in" / "*.tar"), "-o", str(tmp_path / "out" / "{name}.tar"),
            "-b", "serial", "--no-progress", "--extend"]
    assert CliRunner().invoke(main, args).exit_code == 0
    shards(tmp_path / "in", ["c", "d"])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.stderr
    assert "--extend: 2 new tasks (tasks 2..3) after the 2 stored" in result.stdout  # the report's first line
    status = CliRunner().invoke(main, ["status", str(tmp_path / "out" / "_shardflow")])
    assert "  --extend: 2 new tasks (tasks 2..3) after the 2 stored" in status.output  # what the last run did
    assert "4/4 tasks done (2 already done before)" in result.stdout


def test_new_inputs_are_grouped_among_themselves_and_numbered_after_the_stored_tasks(tmp_path):
    shards(tmp_path / "in", ["b", "d", "f"])
    kw = dict(outputs=str(tmp_path / "out" / "part-{task:06d}.tar"), inputs_per_task=2)
    assert job_at(tmp_path, **kw).run("serial", progress=False).done == 2  # [b, d], [f]
    shards(tmp_path / "in", ["a", "c", "e"])  # they sort between the stored ones
    report = job_at(tmp_path, **kw).run("serial", progress=False, extend=True)
    assert (report.tasks, report.skipped) == (4, 2)
    tasks = stored_tasks(RunDir(str(tmp_path / "run")))
    assert [[Path(u).stem for u in t["inputs"]] for t in tasks] == [["b", "d"], ["f"], ["a", "c"], ["e"]]
    assert [Path(t["output"]).name for t in tasks] == [f"part-{i:06d}.tar" for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == [f"part-{i:06d}.tar" for i in range(4)]
    assert keys(tmp_path / "out") == Counter({f"{n}-{i}": 1 for n in "abcdef" for i in range(2)})


def test_a_brace_range_that_reaches_further_extends_the_stored_table(tmp_path):
    shards(tmp_path / "in", [f"in-{i:06d}" for i in range(3)])
    kw = dict(inputs=str(tmp_path / "in" / "in-{000000..000001}.tar"))
    job_at(tmp_path, **kw).run("serial", progress=False)
    report = job_at(tmp_path, inputs=str(tmp_path / "in" / "in-{000000..000002}.tar")).run(
        "serial", progress=False, extend=True)
    assert (report.tasks, report.skipped, report.done) == (3, 2, 3)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["table"]["count"] == 3 and not (tmp_path / "run" / "plan").exists()  # still a table


@pytest.mark.slow
def test_a_plan_in_chunk_files_grows_by_its_last_chunk_and_a_kill_before_plan_json_keeps_the_old(tmp_path):
    names = [f"{i * 7919 % 100_003:05d}x{i}" for i in range(PLAN_CHUNK + 20)]  # no numbering: chunk files
    shards(tmp_path / "in", names, per=1)
    run_dir = job_at(tmp_path).prepare()
    old = stored_tasks(run_dir)
    chunks = tmp_path / "run" / "plan"
    first = (chunks / "chunk-000000.json").stat().st_mtime_ns
    shutil.copytree(tmp_path / "run", tmp_path / "before")
    shards(tmp_path / "in", ["00000new", "zz-new", "m-new"], per=1)
    job = job_at(tmp_path)
    job.prepare(extend=True)
    grown = stored_tasks(run_dir)
    assert grown[: len(old)] == old
    assert [Path(t["inputs"][0]).stem for t in grown[len(old):]] == ["00000new", "m-new", "zz-new"]
    assert [t["id"] for t in grown] == list(range(len(old) + 3))
    assert (chunks / "chunk-000000.json").stat().st_mtime_ns == first  # the full chunk is not written again
    # killed after the new chunk files, before plan.json: the old plan reads its own tasks from them
    shutil.copy(chunks / "chunk-000001.json", tmp_path / "before" / "plan" / "chunk-000001.json")
    assert stored_tasks(RunDir(str(tmp_path / "before"))) == old
    assert [t.id for t in job.plan()] == list(range(len(old) + 3))  # the driver runs the grown plan


def test_a_glob_over_the_output_folder_is_said_as_such(tmp_path):
    data = tmp_path / "data"
    shards(data, ["a", "b"])
    kw = dict(inputs=str(data / "*.tar"), outputs=str(data / "{name}-x.tar"))
    job_at(tmp_path, **kw).run("serial", progress=False)
    shards(data, ["c"])
    with pytest.raises(JobError) as refused:
        job_at(tmp_path, **kw).prepare()
    text = str(refused.value)
    assert "\n" not in text
    assert f"the inputs '{data}/*.tar' match {data}/a-x.tar, this job's own output" in text
    assert "an inputs glob that excludes the outputs, or write the outputs to another folder" in text
    assert "--extend" in text
    with pytest.raises(JobError, match="this job's own output") as elsewhere:  # no stored plan there
        job_at(tmp_path, **kw, run_dir=str(tmp_path / "other")).prepare()
    assert "--extend" not in str(elsewhere.value)
    assert job_at(tmp_path, **kw).run("serial", progress=False, extend=True).done == 3
    assert sorted(p.name for p in data.glob("*-x.tar")) == ["a-x.tar", "b-x.tar", "c-x.tar"]


KILLING_JOB = """
    import os, signal

    def process(sample):
        flag = os.environ.get("KILL_FLAG", "")
        if sample["__key__"] == "c-1" and os.path.exists(flag):
            os.remove(flag)
            os.kill(os.getpid(), signal.SIGKILL)  # the driver, mid-task (serial: tasks run in it)
        return sample
"""


@pytest.mark.slow
def test_a_kill_during_the_extended_run_then_a_rerun_writes_every_sample_once(tmp_path, monkeypatch):
    job = write_job(tmp_path, KILLING_JOB)
    shards(tmp_path / "in", ["a", "b"], per=3)
    args = ["run", job, "-i", tmp_path / "in" / "*.tar", "-o", tmp_path / "out" / "{name}.tar", "-b", "serial",
            "--no-progress", "--extend"]
    assert cli(*args).returncode == 0
    shards(tmp_path / "in", ["c", "d"], per=3)
    flag = tmp_path / "kill"
    flag.write_text("")
    monkeypatch.setenv("KILL_FLAG", str(flag))
    killed = cli(*args)
    assert killed.returncode == -9 and not flag.exists(), killed.stderr
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "4/4 tasks done (2 already done before)" in again.stdout
    assert keys(tmp_path / "out") == Counter({f"{n}-{i}": 1 for n in "abcd" for i in range(3)})


def test_slurm_and_worker_prepare_grow_the_plan_and_count_its_tasks(tmp_path):
    shards(tmp_path / "in", ["b", "d", "f"])
    where = ["-i", f"{tmp_path}/in/*.tar", "-o", f"{tmp_path}/out/part-{{task:06d}}.tar", "--set", "inputs_per_task=2"]
    slurm = ["slurm", "reshard", *where, "--shared-fs"]
    assert CliRunner().invoke(main, slurm).exit_code == 0  # tasks [b, d], [f]
    shards(tmp_path / "in", ["a"])
    plain = CliRunner().invoke(main, slurm)
    assert plain.exit_code == 2 and "--extend (extend=True) to add the new inputs" in plain.stderr
    grown = CliRunner().invoke(main, [*slurm, "--extend"])
    assert grown.exit_code == 0, grown.stderr
    assert "3 tasks" in grown.stderr and "#SBATCH --array=0-2" in grown.stdout  # [a] is task 2
    shards(tmp_path / "in", ["c"])
    worker = CliRunner().invoke(main, ["worker", "--run-dir", f"{tmp_path}/out/_shardflow", "--prepare", "reshard",
                                       *where, "--extend"])
    assert worker.exit_code == 0 and "4 tasks planned" in worker.stdout, worker.output
    tasks = stored_tasks(RunDir(str(tmp_path / "out" / "_shardflow")))
    assert [[Path(u).stem for u in t["inputs"]] for t in tasks] == [["b", "d"], ["f"], ["a"], ["c"]]
    refused = CliRunner().invoke(main, ["k8s", "reshard", *where, "--image", "x", "--extend", "--no-prepare"])
    assert refused.exit_code == 2 and "--no-prepare does not write" in refused.output
