"""The one CLI runner (shardflow/tools/runner.py): `shardflow run` and the shell tools that run a job give
the same exit status and the same lines for the same situations, stop on SIGTERM like Ctrl-C, and offer
every registered backend."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardflow as sf
from shardflow.backends.local import execute_serial
from shardflow.cli import main
from shardflow.job import backend_registry
from tests.support.jobs import REPO, cli_env

PASSTHROUGH = "def process(sample):\n    return sample\n"


def shardflow(*args: object, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m shardflow ARGS...` in a subprocess (text output)."""
    return subprocess.run([sys.executable, "-m", "shardflow", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(), cwd=REPO)


def make_inputs(folder: Path, shards: int = 3, per: int = 20) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = folder / f"in-{s:03d}.tar"
        with sf.TarWriter(str(path)) as w:
            for i in range(per):
                w.write({"__key__": f"k{s}/{i:05d}", "txt": b"x" * 100})
        paths.append(path)
    return paths


def damage_header(path: Path, member: int) -> None:
    """A bad checksum in the header of `member` (each member here is one header and one data block):
    the samples around it are left out and logged, the task still finishes."""
    data = bytearray(path.read_bytes())
    data[member * 1024 + 148:member * 1024 + 156] = b"0000000\0"
    path.write_bytes(bytes(data))


def both(tmp_path: Path, name: str, inputs: list[Path], *extra: object) -> dict[str, subprocess.CompletedProcess]:
    """The same inputs copied by `shardflow run` (a passthrough job file) and by `shardflow split`."""
    job = tmp_path / "copy.py"
    job.write_text(PASSTHROUGH)
    spec = f"{inputs[0].parent}/in-{{000..{len(inputs) - 1:03d}}}.tar"
    common = ("-b", "serial", "--no-progress", *extra)
    return {
        "run": shardflow("run", job, "-i", spec, "-o", tmp_path / f"{name}-run" / "{name}-{part}.tar",
                         "--set", "maxcount=100", *common),
        "split": shardflow("split", spec, "-o", tmp_path / f"{name}-split" / "{name}-{part}.tar",
                           "--maxcount", 100, *common),
    }


def test_run_and_split_exit_alike_when_all_done_or_a_task_failed(tmp_path):
    inputs = make_inputs(tmp_path / "in")
    for command, done in both(tmp_path, "ok", inputs).items():
        assert done.returncode == 0, (command, done.stderr)
        assert "3/3 tasks done" in done.stdout and "shardflow:" not in done.stderr, (command, done.stderr)
    inputs[2].write_bytes(inputs[2].read_bytes()[:5000])  # cut short: its task fails, the others finish
    for command, failed in both(tmp_path, "cut", inputs).items():
        assert failed.returncode == 1, (command, failed.stderr)
        assert "2/3 tasks done" in failed.stdout, (command, failed.stdout)
        assert "shardflow: 1 of 3 tasks failed (tasks 2); fix the cause and run the same command again to retry " \
               "them (shardflow status " in failed.stderr, (command, failed.stderr)


def test_samples_left_out_exit_0_with_the_same_line_for_run_and_split(tmp_path):
    inputs = make_inputs(tmp_path / "in")
    damage_header(inputs[1], 10)
    for command, result in both(tmp_path, "skip", inputs).items():
        assert result.returncode == 0, (command, result.stderr)
        # the damaged region and 3 samples next to it (the one before the damage's sample too: the damage
        # follows that sample's first member, whose header may be a displaced one; see shards/samples.py)
        assert "3/3 tasks done" in result.stdout and "4 failed" in result.stdout, (command, result.stdout)
        lines = [line for line in result.stderr.splitlines() if line.startswith("shardflow:")]
        assert len(lines) == 1 and lines[0].startswith("shardflow: 4 samples failed and were left out; see "
                                                       "`shardflow status "), (command, result.stderr)


@pytest.mark.parametrize("flags, message", [
    (("--address", "tcp://127.0.0.1:1"), "--address is for --backend dask or ray"),
    (("--workers", "2"), "--workers is for --backend processes or dask or ray"),
])
def test_an_option_the_backend_does_not_take_is_exit_2_for_run_and_split(tmp_path, flags, message):
    inputs = make_inputs(tmp_path / "in", shards=1)
    for command, refused in both(tmp_path, "bad", inputs, *flags).items():
        assert refused.returncode == 2, (command, refused.stderr)
        assert refused.stderr.strip().splitlines()[-1] == f"shardflow: error: {message}", (command, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert not (tmp_path / f"bad-{command}").exists()  # nothing planned, nothing written


@pytest.mark.slow
def test_sigterm_stops_split_with_130_and_a_rerun_resumes(tmp_path):
    inputs = make_inputs(tmp_path / "in", shards=4)
    slow = [f"pipe:sleep 1; cat {path}" for path in inputs]  # each task takes a second at least
    args = [sys.executable, "-m", "shardflow", "split", *slow, "-o", str(tmp_path / "out" / "part-{task}-{part}.tar"),
            "--maxcount", "7", "--allow-pipe", "-w", "1", "--no-progress"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                               cwd=REPO)
    done = tmp_path / "out" / "_shardflow" / "done"
    deadline = time.monotonic() + 60
    while not (done.exists() and any(done.iterdir())) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    finished = len(list(done.iterdir()))
    assert 1 <= finished < 4 and "interrupted" in out
    assert f"shardflow: interrupted with {finished} of 4 tasks done; run the same command again to resume" in err
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]  # nothing half-written under a name
    rerun = subprocess.run(args, capture_output=True, text=True, env=cli_env(), cwd=REPO, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"4/4 tasks done ({finished} already done before)" in rerun.stdout
    copied = [s["__key__"] for p in sorted((tmp_path / "out").glob("part-*.tar"), key=lambda p: p.name)
              for s in sf.read_samples(str(p))]
    assert sorted(copied) == sorted(f"k{s}/{i:05d}" for s in range(4) for i in range(20))


CALLS: list[dict] = []


def execute_here(job, tasks, progress, *, workers=None):
    """A backend of this test module: runs tasks in this process, recording that it was chosen."""
    CALLS.append({"tasks": len(tasks), "workers": workers})
    yield from execute_serial(job, tasks, progress)


def test_a_registered_backend_is_a_choice_of_run_and_split(tmp_path, monkeypatch):
    monkeypatch.setattr(backend_registry, "BACKENDS", dict(backend_registry.BACKENDS))
    backend_registry.register_backend("here", f"{__name__}:execute_here")  # after main() was imported
    runner = CliRunner()
    for command in ("run", "split"):
        shown = runner.invoke(main, [command, "--help"])
        choices = "|".join(backend_registry.BACKENDS)  # every registered backend, the new one last
        assert shown.exit_code == 0 and f"[{choices}]" in shown.output and choices.endswith("|here"), shown.output
    inputs = make_inputs(tmp_path / "in", shards=2)
    job = tmp_path / "copy.py"
    job.write_text(PASSTHROUGH)
    CALLS.clear()
    ran = runner.invoke(main, ["run", str(job), "-i", f"{tmp_path}/in/in-{{000..001}}.tar", "-o",
                               str(tmp_path / "run" / "{name}.tar"), "-b", "here", "-w", "3", "--no-progress"])
    assert ran.exit_code == 0, ran.output
    split = runner.invoke(main, ["split", *map(str, inputs), "-o", str(tmp_path / "split" / "{name}-{part}.tar"),
                                 "--maxcount", "5", "-b", "here", "--no-progress"])
    assert split.exit_code == 0, split.output
    assert CALLS == [{"tasks": 2, "workers": 3}, {"tasks": 2, "workers": None}]
    assert len(list((tmp_path / "split").glob("*.tar"))) == 8
    refused = runner.invoke(main, ["split", *map(str, inputs), "-o", str(tmp_path / "x" / "{name}.tar"),
                                   "--maxcount", "5", "-b", "here", "--address", "tcp://127.0.0.1:1"])
    assert refused.exit_code == 2 and "--address is for --backend dask" in refused.output


def test_flags_that_set_job_settings_take_help_and_default_from_jobspec():
    from shardflow.errors import DEFAULT_ON_ERROR_JOB
    from shardflow.task.spec import setting_help

    for command, names in (("split", ("maxcount", "maxsize", "on_error", "allow_pipe", "run_dir")),
                           ("map", ("maxcount", "maxsize", "on_error", "allow_pipe", "run_dir")),
                           ("sort", ("on_error", "allow_pipe", "run_dir")), ("run", ("run_dir",))):
        params = {p.name: p for p in main.commands[command].params}
        for name in names:
            assert params[name].help == setting_help(name), (command, name)
        if "on_error" in names:
            assert params["on_error"].default == DEFAULT_ON_ERROR_JOB
    assert main.commands["cat"].callback.__module__ == "shardflow.cli.tools_jobs"  # one owner of `cat`


def test_heartbeat_0_reaches_the_driver():
    from shardflow.cli.trying import flag_values

    assert flag_values({"heartbeat": 0.0, "debug": False, "limit": None}) == {"heartbeat": 0.0}
