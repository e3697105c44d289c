"""`redo` means "start over" whatever changed: with the same plan and code it ran nothing ("4 already
done before"), and after a code change it deleted the plan's own chunk files, leaving a run directory
whose plan.json names files that no longer exist (every later run failed with FileNotFoundError)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.rundir.plan_store import PLAN_CHUNK


def copy(sample):
    return sample


def copy_too(sample):
    return dict(sample)


def one_sample_shards(folder: Path, names: list[str]) -> str:
    folder.mkdir()
    for name in names:
        with tarfile.open(folder / f"{name}.tar", "w") as tf:
            info = tarfile.TarInfo(f"{name}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    return str(folder / "*.tar")


def test_a_redo_with_the_same_plan_and_code_runs_every_task_again(tmp_path):
    inputs = one_sample_shards(tmp_path / "in", ["a", "b", "c"])
    job = sf.ShardJob(copy, inputs=inputs, outputs=str(tmp_path / "out" / "{name}.tar"), run_dir=str(tmp_path / "run"))
    first = job.run(backend="serial", progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    again = job.run(backend="serial", progress=False)
    redone = job.run(backend="serial", progress=False, redo=True)
    assert first.done == again.done == redone.done == 3
    assert (again.skipped, again.processed) == (3, 0)  # a plain rerun resumes: nothing to do
    assert (redone.skipped, redone.processed) == (0, 3)  # a redo runs every task again
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_a_redo_after_a_code_change_keeps_the_plans_chunk_files(tmp_path):
    # names that follow no numbering, more than one chunk of them: the tasks are stored in plan/chunk-*.json
    names = [f"{i * 7919 % 100_003:05d}x{i}" for i in range(PLAN_CHUNK + 20)]
    inputs = one_sample_shards(tmp_path / "in", names)
    kw = dict(inputs=inputs, outputs=str(tmp_path / "out" / "{name}.tar"), run_dir=str(tmp_path / "run"))
    run_dir = sf.ShardJob(copy, **kw).prepare()
    chunks = sorted(p.name for p in (tmp_path / "run" / "plan").iterdir())
    assert len(chunks) == 2
    run_dir = sf.ShardJob(copy_too, **kw).prepare(redo=True)
    assert sorted(p.name for p in (tmp_path / "run" / "plan").iterdir()) == chunks
    plan = run_dir.load_plan()
    tasks = list(run_dir.load_tasks(plan, range(run_dir.task_count(plan))))
    assert [Path(t.inputs[0]).stem for t in tasks] == sorted(names)


def _shard(path: Path, keys: list[str]) -> None:
    with tarfile.open(path, "w") as tf:
        for key in keys:
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))


def _keys(folder: Path) -> list[str]:
    from shardflow.shards.samples import read_samples

    return sorted(s["__key__"] for p in folder.glob("*.tar") for s in read_samples(str(p)))


def test_a_redo_that_writes_fewer_parts_removes_the_parts_the_earlier_run_wrote_beyond(tmp_path):
    """maxcount 2 wrote in-00, in-01, in-02; the redo with maxcount 5 wrote in-00 only and left the other
    two, so c, d and e were there twice."""
    (tmp_path / "in").mkdir()
    _shard(tmp_path / "in" / "in.tar", list("abcde"))
    kw = dict(inputs=str(tmp_path / "in" / "in.tar"), outputs=str(tmp_path / "out" / "{name}-{part:02d}.tar"))
    sf.ShardJob(copy, maxcount=2, **kw).run(backend="serial", progress=False)
    assert len(list((tmp_path / "out").glob("*.tar"))) == 3
    sf.ShardJob(copy, maxcount=5, **kw).run(backend="serial", progress=False, redo=True)
    assert [p.name for p in (tmp_path / "out").glob("*.tar")] == ["in-00.tar"]
    assert _keys(tmp_path / "out") == list("abcde")


def test_a_rollover_part_that_would_be_another_tasks_output_is_refused(tmp_path):
    """Re-splitting `a.tar` and `a_001.tar` (an earlier split's parts) into `{name}.tar`: task 0's part 1
    was named a_001.tar, the output of task 1; one replaced the other and two samples were lost."""
    (tmp_path / "in").mkdir()
    _shard(tmp_path / "in" / "a.tar", ["s0", "s1", "s2", "s3"])
    _shard(tmp_path / "in" / "a_001.tar", ["k0", "k1"])
    kw = dict(inputs=str(tmp_path / "in" / "*.tar"), maxcount=2)
    with pytest.raises(JobError, match=r"rollover part 1 of task 0 .* would be '.*a_001.tar', the output of task 1"):
        sf.ShardJob(copy, outputs=str(tmp_path / "out" / "{name}.tar"), **kw).plan()
    with pytest.raises(JobError, match="rollover part 100 of task 0"):  # explicit {part} fields too: a100 = a + 100
        sf.ShardJob(copy, inputs=[str(tmp_path / "in" / "a.tar"), str(tmp_path / "in" / "a10.tar")],
                    outputs=str(tmp_path / "out" / "{name}{part}.tar"), maxcount=2).plan()
    sf.ShardJob(copy, outputs=str(tmp_path / "out" / "{name}-{part:03d}.tar"), **kw).run(backend="serial",
                                                                                          progress=False)
    assert _keys(tmp_path / "out") == ["k0", "k1", "s0", "s1", "s2", "s3"]
    assert sf.ShardJob(copy, outputs=str(tmp_path / "o2" / "{name}.tar"), inputs=kw["inputs"]).plan()  # no rollover
