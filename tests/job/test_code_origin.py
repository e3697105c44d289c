"""A job file's failure names the job file and its source line, whatever cloudpickle version pickled it.

cloudpickle 3.1.3 writes `<dynamic-code>` as the file of every function it sends by value (a job file's,
a script's `__main__`); 3.1.2 kept the path. The run must name `buggy.py, line 5` with both: the job
carries its code's origin (shardflow.job.code_origin). The 3.1.3 case runs the CLI with that wheel first
on PYTHONPATH (downloaded from the package index; skipped where the index cannot be reached).
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
import zipfile
from pathlib import Path

import cloudpickle
import pytest

from shardflow.job import code_origin
from shardflow.tools.demo import write_synthetic_shards

BUGGY = '''import shardflow as sf


def helper(sample):
    return sample["nope"]


def process(sample):
    return helper(sample)
'''


@pytest.fixture(scope="module")
def cloudpickle_3_1_3(tmp_path_factory) -> Path:
    """A folder holding cloudpickle 3.1.3 (the version that writes <dynamic-code>), for PYTHONPATH."""
    folder = tmp_path_factory.mktemp("cloudpickle-3.1.3")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder),
                          "cloudpickle==3.1.3"], capture_output=True, text=True, timeout=120)
    wheels = list(folder.glob("cloudpickle-3.1.3-*.whl"))
    if got.returncode or not wheels:
        pytest.skip(f"cannot download cloudpickle 3.1.3 from the package index: {got.stderr.strip()[-200:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(folder)
    return folder


def _run_buggy(tmp_path: Path, pythonpath: str | None) -> str:
    (tmp_path / "buggy.py").write_text(BUGGY)
    write_synthetic_shards(tmp_path / "in", 2, 3, size=(16, 16))
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    probe = subprocess.run([sys.executable, "-c", "import cloudpickle; print(cloudpickle.__version__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    version = probe.stdout.strip()
    done = subprocess.run([sys.executable, "-m", "shardflow", "run", "buggy.py", "-i", "in/train-{000000..000001}.tar",
                           "-o", "out/{name}.tar", "--backend", "processes", "--workers", "1", "--no-progress"],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr
    status = subprocess.run([sys.executable, "-m", "shardflow", "status", "out/_shardflow"], env=env,
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    return version + "\n" + done.stdout + done.stderr + status.stdout


@pytest.mark.slow
@pytest.mark.parametrize("version", ["pinned", "3.1.3"])
def test_failure_names_the_job_file_and_its_line(tmp_path, request, version):
    path = str(request.getfixturevalue("cloudpickle_3_1_3")) if version == "3.1.3" else None
    text = _run_buggy(tmp_path, path)
    assert text.splitlines()[0] == (cloudpickle.__version__ if version == "pinned" else "3.1.3")
    assert "at buggy.py, line 5, in helper" in text
    assert 'File "buggy.py", line 9, in process' in text and 'return sample["nope"]' in text
    assert "<dynamic-code>" not in text


def test_restore_names_the_file_in_nested_code_and_gives_tracebacks_the_source(tmp_path):
    path = tmp_path / "gone.py"  # recorded on the driver, absent where the job is unpickled
    source = "def outer(x):\n    inner = lambda y: 1 / y\n    return inner(x)\n"
    namespace: dict = {"__name__": "jobfile_gone"}
    exec(compile(source, "<dynamic-code>", "exec"), namespace)  # what cloudpickle 3.1.3 hands the worker
    outer = namespace["outer"]
    code_origin.restore(outer, {"module": "jobfile_gone", "path": str(path), "source": source})
    with pytest.raises(ZeroDivisionError) as caught:
        outer(0)
    frames = traceback.extract_tb(caught.value.__traceback__)[-2:]  # outer, then the lambda nested in it
    assert [(f.filename, f.lineno, f.line) for f in frames] == [
        (str(path), 3, "return inner(x)"), (str(path), 2, "inner = lambda y: 1 / y")]


def test_capture_reads_the_defining_file():
    origin = code_origin.capture(test_capture_reads_the_defining_file)
    assert origin is not None and origin["path"] == __file__ and "def test_capture_reads" in origin["source"]
    assert code_origin.capture(len) is None  # builtins: no file (not print: a Ray driver replaces it)
