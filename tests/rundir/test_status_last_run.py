"""What `status` says of the last run: a rerun that found every task done printed "last run ended: 3/3
tasks done, 0 samples processed in 0.0 s", which reads as a run that did nothing wrong, or nothing at all."""

from __future__ import annotations

import io
import tarfile

import shardflow as sf
from shardflow.rundir.status import read_status


def _copy(sample):
    return sample


def test_status_says_what_the_last_run_did(tmp_path):
    (tmp_path / "in").mkdir()
    for name in ("a", "b", "c"):
        with tarfile.open(tmp_path / "in" / f"{name}.tar", "w") as tf:
            info = tarfile.TarInfo(f"{name}.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    job = sf.ShardJob(_copy, inputs=str(tmp_path / "in" / "*.tar"), outputs=str(tmp_path / "out" / "{name}.tar"),
                      run_dir=str(tmp_path / "run"))
    job.run(backend="serial", progress=False)
    first = str(read_status(str(tmp_path / "run")))
    assert "last run ended: 3/3 tasks done (0 of them before it), 3 samples processed" in first
    job.run(backend="serial", progress=False)
    again = str(read_status(str(tmp_path / "run")))
    assert "last run found all 3 tasks done before it started: nothing to run" in again
