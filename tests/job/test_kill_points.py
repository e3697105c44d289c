"""Kills at the two points a chaos run found unsafe: inside the sweep of a redone task's extra parts
(samples left twice, for good) and inside a redo's forgetting (a run that reads as complete while no task
of it ran again). A kill is stood in for by an error raised at exactly that point."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import shardflow as sf
from shardflow.rundir.run_dir import RunDir
from shardflow.shards.task_files import remove_parts_after


def copy(sample):
    return sample


def shards(folder: Path, count: int, per_shard: int) -> str:
    folder.mkdir()
    for s in range(count):
        with tarfile.open(folder / f"in{s}.tar", "w") as tf:
            for i in range(per_shard):
                info = tarfile.TarInfo(f"s{s}_{i:03d}.txt")
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
    return str(folder / "in*.tar")


def test_a_sweep_of_extra_parts_killed_midway_leaves_no_part_behind_a_gap(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def part(i: int) -> str:
        return str(out / f"t_{i:03d}.tar")

    for i in range(10):  # an earlier run's ten parts; this run wrote two
        Path(part(i)).write_bytes(b"old")
    blocker = Path(part(5))  # a part the sweep cannot delete this time: the kill midway
    blocker.unlink()
    blocker.mkdir()
    with pytest.raises(OSError):
        remove_parts_after(part, 2)
    left = sorted(p.name for p in out.iterdir())
    # what is left is still a run from part 2 up, with no gap the next sweep would stop at
    assert left == [f"t_{i:03d}.tar" for i in range(len(left))] and len(left) > 2
    blocker.rmdir()
    blocker.write_bytes(b"old")  # the next attempt can delete everything
    remove_parts_after(part, 2)
    assert sorted(p.name for p in out.iterdir()) == ["t_000.tar", "t_001.tar"]


def test_a_redo_killed_while_forgetting_does_not_read_as_complete(tmp_path, monkeypatch):
    job = sf.ShardJob(copy, inputs=shards(tmp_path / "in", 3, 2), outputs=str(tmp_path / "out" / "{name}.tar"),
                      run_dir=str(tmp_path / "run"))
    assert job.run(backend="serial", progress=False).done == 3
    listed = RunDir.list_names

    def killed_at_failed(self, folder, **kw):
        if folder == "failed":  # after the markers in any order the forgetting may take
            raise KeyboardInterrupt
        return listed(self, folder, **kw)

    monkeypatch.setattr(RunDir, "list_names", killed_at_failed)
    with pytest.raises(KeyboardInterrupt):
        job.run(backend="serial", progress=False, redo=True)
    monkeypatch.setattr(RunDir, "list_names", listed)
    assert job.rundir().done_ids() == set()
    again = job.run(backend="serial", progress=False)  # a plain rerun after the killed redo runs every task
    assert (again.done, again.processed, again.skipped) == (3, 6, 0)  # 3 tasks of 2 samples


def test_a_failed_task_names_the_shards_it_left_under_final_names(tmp_path):
    inputs = shards(tmp_path / "in", 2, 6)
    broken = tmp_path / "in" / "in1.tar"
    broken.write_bytes(broken.read_bytes()[:2048])  # the second input ends inside its second member
    job = sf.ShardJob(copy, inputs=inputs, outputs=str(tmp_path / "out" / "t{task}_{part:03d}.tar"),
                      run_dir=str(tmp_path / "run"), inputs_per_task=2, maxcount=2, on_error="skip")
    report = job.run(backend="serial", progress=False)
    assert list(report.failed) == [0]
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert left[:3] == ["t0_000.tar", "t0_001.tar", "t0_002.tar"]  # the first input's six samples, committed
    record = job.rundir().read_json("failed/000000.json")
    assert f"{len(left)} of its output shards exist (t0_000.tar, t0_001.tar, t0_002.tar" in record["error"]
    assert "replaced when the task runs again" in record["error"]
