"""Issue 26 item 13: code-change detection of script jobs (a Python script that defines fn and runs the
job, run twice as a user runs it): a module-level constant fn reads is part of the code, and a
functools.partial fn gets the same digest on an identical rerun."""

from __future__ import annotations

import subprocess
import sys

from tests.support.jobs import cli_env, make_shards, spec, write_job

SCRIPT = """
    import functools, sys
    import shardflow as sf

    VERSION = "v1"

    def tag(sample, suffix=""):
        return {"__key__": sample["__key__"], "txt": VERSION + suffix}

    fn = functools.partial(tag, suffix="!") if sys.argv[3] == "partial" else tag
    job = sf.ShardJob(fn, sys.argv[1], sys.argv[2], name="tag")
    try:
        report = job.run("serial", progress=False)
    except sf.JobError as exc:
        print(f"refused: {exc}")
        sys.exit(2)
    print(f"done {report.done}, skipped {report.skipped}")
"""


def _run(script, inputs: str, outputs: str, kind: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), inputs, outputs, kind], capture_output=True, text=True,
                          env=cli_env(), timeout=120)


def test_a_changed_module_constant_of_a_script_job_is_a_code_change(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    script = write_job(tmp_path, SCRIPT, "make_tags.py")
    inputs, outputs = spec(tmp_path / "in", "in", 2), str(tmp_path / "out" / "{name}.tar")
    assert _run(script, inputs, outputs, "plain").returncode == 0
    script.write_text(script.read_text().replace('VERSION = "v1"', 'VERSION = "v2"'))
    again = _run(script, inputs, outputs, "plain")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "the job's code differs" in again.stdout and "the module that defines" in again.stdout


def test_a_partial_fn_is_the_same_code_on_an_identical_rerun(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    script = write_job(tmp_path, SCRIPT, "make_tags.py")
    inputs, outputs = spec(tmp_path / "in", "in", 2), str(tmp_path / "out" / "{name}.tar")
    assert _run(script, inputs, outputs, "partial").returncode == 0
    again = _run(script, inputs, outputs, "partial")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "done 2, skipped 2" in again.stdout
