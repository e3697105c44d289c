"""Scripts whose worker processes would import them and run the job again (no `if __name__ == "__main__":`),
or could not import them at all (code piped to `python -`): the processes backend and Dask's LocalCluster
end the script with one line naming the fix, before any worker starts (backends.main_guard). Real
scripts in real interpreters; a guarded script runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardflow.backends.main_guard import _under_guard
from tests.support.jobs import cli_env, make_shards, tars

SCRIPT = """
import shardflow as sf


def copy(sample):
    return {{"__key__": sample["__key__"], "jpg": sample["jpg"]}}


{body}
"""
RUN = 'sf.ShardJob(copy, "in/in-{{000000..000002}}.tar", "out/{{name}}.tar").run({args}, progress=False)'
HINT = 'put the code that runs the job under `if __name__ == "__main__":`'


def _python(tmp_path: Path, body: str, *, stdin: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    tmp_path.mkdir(exist_ok=True)
    make_shards(tmp_path / "in", 3, 2)
    code = textwrap.dedent(SCRIPT).format(body=textwrap.dedent(body))
    (tmp_path / "job.py").write_text(code)
    command = [sys.executable, "-"] if stdin else [sys.executable, "job.py"]
    return subprocess.run(command, input=code if stdin else None, capture_output=True, text=True, cwd=tmp_path,
                          env={**cli_env(), "SHARDFLOW_ALWAYS_POOL": "1"}, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    lines = [line for line in done.stderr.splitlines() if "shardflow: the " in line]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and all(word in lines[0] for word in words), done.stderr
    return lines[0]


@pytest.mark.slow  # two interpreters
def test_a_script_without_the_main_guard_gets_one_line_from_the_processes_backend(tmp_path):
    done = _python(tmp_path, RUN.format(args='"processes", workers=2'))
    line = _one_line(done, "processes backend", str(tmp_path / "job.py"), "line 9", HINT)
    assert not tars(tmp_path / "out"), line  # no worker started, nothing ran
    piped = _python(tmp_path / "piped", RUN.format(args='"processes", workers=2'), stdin=True)
    _one_line(piped, "processes backend", "<stdin>", "no file", HINT)


@pytest.mark.slow  # one interpreter and a pool
def test_a_guarded_script_runs_on_the_processes_backend(tmp_path):
    done = _python(tmp_path, f"""
        def main():
            {RUN.format(args='"processes", workers=2')}


        if "__main__" == __name__:
            try:
                main()
            finally:
                pass
    """)
    assert done.returncode == 0, done.stderr
    assert len(tars(tmp_path / "out")) == 3


@pytest.mark.slow  # two interpreters (no cluster starts: the check comes first)
def test_a_script_without_the_main_guard_gets_one_line_from_the_dask_local_cluster(tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install -e '.[dask]')")
    done = _python(tmp_path, RUN.format(args='"dask", workers=1, dashboard_address=":0"'))
    _one_line(done, "dask backend's LocalCluster", str(tmp_path / "job.py"), HINT)
    assert "Nanny" not in done.stderr and len(done.stderr.splitlines()) <= 2, done.stderr  # the bar's line at most
    piped = _python(tmp_path / "piped", RUN.format(args='"dask", workers=1, dashboard_address=":0"'), stdin=True)
    _one_line(piped, "dask backend's LocalCluster", "<stdin>", HINT)


@pytest.mark.parametrize(("code", "line", "guarded"), [
    ('run()\n', 1, False),
    ('if __name__ == "__main__":\n    run()\n', 2, True),
    ("if '__main__' == __name__:\n    try:\n        run()\n    finally:\n        pass\n", 3, True),
    ('if __name__ == "__main__":\n    pass\nelse:\n    run()\n', 4, False),  # the else branch runs in workers
    ('if __name__ != "__main__":\n    run()\n', 2, False),
    ('def main():\n    run()\n\n\nmain()\n', 5, False),
])
def test_the_guard_is_read_from_the_scripts_syntax(tmp_path, code, line, guarded):
    script = tmp_path / "script.py"
    script.write_text(code)
    assert _under_guard(str(script), line) is guarded
