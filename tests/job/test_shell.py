"""`shardflow map -c CMD` / sf.ShellJob / COMMAND job files: real sh, real ImageMagick, real tar.

The tarproc example (convert resizing every jpg) on a demo shard, resumed after SIGKILL; member names
from the tar are data and never escape the sample's directory or reach the shell as code; failures and
timeouts are failed samples with the command's stderr in errors/; -p N keeps the output identical.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardflow as sf
from shardflow.cli import main
from shardflow.job.shell import ShellCommand
from shardflow.job.shell_files import member_file_name
from shardflow.tools.demo import write_synthetic_shards

CONVERT = shutil.which("convert")
needs_convert = pytest.mark.skipif(CONVERT is None, reason="ImageMagick `convert` is not installed")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def cli_cmd():
    exe = shutil.which("shardflow", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "shardflow.cli"]


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tar"))}


def text_shard(path: Path, n: int = 12) -> str:
    with sf.TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"s/{i:04d}", "txt": f"hello {i}\n".encode(), "cls": b"%d" % (i % 3)})
    return str(path)


# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_convert
def test_convert_resizes_every_jpg_and_resumes_after_sigkill(tmp_path):
    """The talk's example: 3 demo shards, convert per sample; SIGKILL mid-run, rerun finishes the rest
    with bytes identical to an uninterrupted run."""
    write_synthetic_shards(tmp_path / "in", shards=3, samples_per_shard=3, size=(64, 48))
    spec = str(tmp_path / "in" / "train-{000000..000002}.tar")
    resize = 'for f in *.jpg; do convert "$f" -resize 32x32 "$f"; done; sleep 0.1'
    clean = run("map", spec, "-o", tmp_path / "clean" / "{name}.tar", "-c", resize, "-b", "serial", "--no-progress")
    assert clean.exit_code == 0, clean.output
    for sample in sf.read_samples(str(tmp_path / "clean" / "train-000000.tar")):
        from PIL import Image

        assert Image.open(io.BytesIO(sample["jpg"])).size == (32, 24)
        assert json.loads(sample["json"])["label"] is not None  # untouched members kept

    out = tmp_path / "out"
    cmd = [*cli_cmd(), "map", spec, "-o", str(out / "{name}.tar"), "-c", resize, "-b", "serial", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = out / "_shardflow" / "done"
    deadline = time.monotonic() + 60
    while not (done.is_dir() and len(list(done.glob("*.json"))) >= 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = len(list(done.glob("*.json")))
    assert 1 <= finished < 3, "the kill should land mid-run"
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"({finished} already done before)" in again.stdout
    assert digests(out) == digests(tmp_path / "clean")
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]


HOSTILE = [
    "-rf.txt", "a b.txt", "new\nline.txt", "\udcff\udcfe.txt", "x.-rf", "$(touch pwned1).txt",
    "`touch pwned2`.txt", "a;touch pwned3.txt", "--help.txt", "y.$(touch pwned4)", "../up.txt",
    "d/../../evil.txt", "/abs/olute.txt",
]


def hostile_shard(path: Path) -> str:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
        for name in HOSTILE:
            data = name.encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_hostile_member_names_never_escape_or_execute(tmp_path, monkeypatch):
    """Names with '/', '..', a leading '-', spaces, newlines, non-UTF-8 bytes and shell syntax: the
    command sees plain safe file names (cat * and rm * work), nothing is written outside the sample's
    directory, nothing in a name runs, and every member comes back under its own extension."""
    monkeypatch.chdir(tmp_path)
    spec = hostile_shard(tmp_path / "hostile.tar")
    command = 'cat * > all.cat && ls > names.lst && for f in *; do test -f "$f" || exit 9; done'
    job = sf.ShellJob(command, spec, str(tmp_path / "out" / "{name}.tar"), on_error="skip", max_failure_rate=1.0,
                      tmpdir=str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    report = job.run("serial", progress=False)
    assert report.ok, str(report)
    found = {p.name for p in tmp_path.rglob("*")}
    assert not {n for n in found if n.startswith("pwned") or n in ("up.txt", "evil.txt", "olute.txt")}
    assert not Path("/abs").exists() and not list((tmp_path / "scratch").iterdir())  # directories removed
    by_key = {s["__key__"]: s for s in sf.read_samples(str(tmp_path / "out" / "hostile.tar"))}
    for name in HOSTILE:
        key, ext = sf.split_name(name)
        if key.startswith("/") or ".." in key.split("/"):
            assert key not in by_key  # the writer refuses such keys: logged as failed samples
            continue
        sample = by_key[key]
        original = name.encode("utf-8", "surrogateescape")
        assert sample[ext] == original and sample["cat"] == original  # exact round trip; `cat *` read it
        seen = sample["lst"].decode("ascii").splitlines()  # what the command saw: safe names only
        assert sorted(seen) == sorted(["all.cat", "names.lst", member_file_name(key, ext)])
        assert all(n.isprintable() and not n.startswith(("-", ".")) and " " not in n for n in seen)
    errors = (tmp_path / "out" / "_shardflow" / "errors" / "000000.jsonl").read_text().splitlines()
    # hostile names in the input are the input's fault, found when its keys are read (not the command's)
    assert len(errors) == 3 and all(json.loads(e)["stage"] == "read" for e in errors)


def test_safe_file_names():
    for name in HOSTILE:
        key, ext = sf.split_name(name)
        file = member_file_name(key, ext)
        assert "/" not in file and file.isprintable() and file.isascii() and " " not in file
        assert not file.startswith(("-", ".")) and file not in (".", "..")
        assert file.partition(".")[2]  # an extension survives


def test_failure_and_timeout_are_failed_samples_with_stderr_in_errors(tmp_path):
    """exit 3 -> failed sample whose reason holds the stderr tail; a timeout kills the whole process
    group (a background child too); the CLI exits 1 when the task fails on its failure rate."""
    spec = text_shard(tmp_path / "in.tar", 12)
    (tmp_path / "pids").mkdir()
    command = ('if [ "$(cat *.cls)" = 1 ]; then echo "bad label in $(ls *.txt)" >&2; exit 3; fi; '
               'if [ "$(cat *.cls)" = 2 ]; then sleep 30 & echo $! > "$PIDS/$$"; sleep 30; fi; echo ok > out.ok')
    started = time.monotonic()
    result = run("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", command, "--timeout", "0.5", "-p", "4",
                 "--env", f"PIDS={tmp_path / 'pids'}", "-b", "serial", "--no-progress")
    assert time.monotonic() - started < 20
    assert result.exit_code == 1, result.output  # 8 of 12 is more than the default max_failure_rate: task fails
    assert "8 of 12 samples failed (more than max_failure_rate=0.5)" in result.output
    errors = [json.loads(line) for line in
              (tmp_path / "out" / "_shardflow" / "errors" / "000000.jsonl").read_text().splitlines()]
    by_key = {e["key"]: e for e in errors}
    assert sorted(by_key) == [f"s/{i:04d}" for i in range(12) if i % 3]
    assert "exited with status 3" in by_key["s/0001"]["reason"]
    assert "bad label in 0001.txt" in by_key["s/0001"]["reason"]
    assert "timed out after 0.5 s" in by_key["s/0002"]["reason"]
    pids = [int(p.read_text()) for p in (tmp_path / "pids").iterdir()]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(running, pids))  # the background `sleep 30` went with its process group


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for a reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
def test_clean_environment_and_parallel_output_is_identical(tmp_path, monkeypatch):
    """Only PATH, a UTF-8 locale, a private HOME/TMPDIR and what the user passes reach the command;
    -p 4 runs commands at the same time and still gives the samples of -p 1, in the same order."""
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("WANTED", "passed")
    spec = text_shard(tmp_path / "in.tar", 8)
    (tmp_path / "busy").mkdir()
    # Each command marks itself busy; with WAIT=1 it waits (up to 5 s, not a fixed sleep: a loaded machine
    # may start commands far apart) until another command is busy too. Seen = how many others were busy.
    command = ('touch "$BUSY/$$"; i=0; while [ "$WAIT" = 1 ] && [ $(ls "$BUSY" | wc -l) -lt 2 ] && [ $i -lt 50 ]; '
               'do sleep 0.1; i=$((i+1)); done; n=$(ls "$BUSY" | wc -l); rm "$BUSY/$$"; echo $((n-1)) > seen.num; '
               'case "$HOME" in "$TMPDIR") ;; *) exit 7;; esac; '
               'env | grep -v -e "^PWD=" -e "^SHLVL=" -e "^_=" -e "^BUSY=" -e "^HOME=" -e "^TMPDIR=" -e "^WAIT=" '
               '-e "^SHARDFLOW_COMMAND_TOKEN=" '
               '| sort > vars.env; '
               'tr a-z A-Z < "$(ls *.txt)" > upper.up')
    outputs = {}
    for parallel in (1, 4):
        out = tmp_path / f"p{parallel}"
        result = run("map", spec, "-o", out / "{name}.tar", "-c", command, "-p", parallel, "--env", "EXTRA=1",
                     "--pass-env", "WANTED", "--env", f"BUSY={tmp_path / 'busy'}", "--env", f"WAIT={int(parallel > 1)}",
                     "-b", "serial", "--no-progress")
        assert result.exit_code == 0, result.output
        samples = list(sf.read_samples(str(out / "in.tar")))
        outputs[parallel] = [{k: v for k, v in s.items() if k not in ("__url__", "num")} for s in samples]
        seen = [int(s["num"]) for s in samples]
        assert (max(seen) >= 1) == (parallel > 1), (parallel, seen)  # overlapping only with -p 4
    assert outputs[1] == outputs[4]  # same samples, same order
    first = outputs[1][0]
    assert first["up"] == b"HELLO 0\n" and first["txt"] == b"hello 0\n"
    variables = dict(line.split("=", 1) for line in first["env"].decode().splitlines())
    assert variables == {"EXTRA": "1", "WANTED": "passed", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                         "PATH": os.environ["PATH"]}


JOB_FILE = '''"""Upper-case the text."""
COMMAND = 'tr a-z A-Z < "$(ls *.txt)" > x && mv x "$(ls *.txt)"'
PARALLEL = 2
TIMEOUT = 60
'''


@pytest.mark.slow
def test_command_job_file_runs_locally_and_as_kubernetes_and_argo(tmp_path):
    """A job file with COMMAND = ... (no process): `shardflow run`, and `shardflow k8s`/`argo` manifests
    whose pods (run by the local pod runner of the k8s tests) do the same work."""
    from tests.support.k8s import make_shards, output_keys, run_indexed_job, run_workflow

    make_shards(tmp_path / "in", 4, 3)
    jobfile = tmp_path / "upper.py"
    jobfile.write_text(JOB_FILE)
    spec = str(tmp_path / "in" / "in-{000000..000003}.tar")
    local = run("run", jobfile, "--inputs", spec, "--outputs", tmp_path / "local" / "{name}.tar", "-b", "serial")
    assert local.exit_code == 0, local.output
    expected = digests(tmp_path / "local")
    sample = next(iter(sf.read_samples(str(tmp_path / "local" / "in-000000.tar"))))
    assert set(sample) == {"__key__", "__url__", "txt"} and sample["txt"].startswith(b"SAMPLE 0 0")
    for kind in ("k8s", "argo"):
        out = tmp_path / kind
        result = CliRunner().invoke(main, [kind, str(jobfile), "--inputs", spec, "--outputs", f"{out}/{{name}}.tar",
                                           "--image", "shardflow:test", "--tasks-per-pod", "2",
                                           "--pvc", f"data:{tmp_path}"])
        assert result.exit_code == 0, result.output
        import yaml

        manifest = yaml.safe_load(result.stdout)
        if kind == "k8s":
            assert run_indexed_job(manifest, tmp_path / f"pods-{kind}").complete
        else:
            assert run_workflow(manifest, tmp_path / f"pods-{kind}")[0] == "Succeeded"
        assert digests(out) == expected
        assert output_keys(out) == output_keys(tmp_path / "local")


def test_a_command_that_leaves_no_file_drops_the_sample(tmp_path):
    spec = text_shard(tmp_path / "in.tar", 9)
    result = run("map", spec, "-o", tmp_path / "out" / "{name}.tar", "-c", '[ "$(cat *.cls)" = 0 ] || rm *',
                 "-b", "serial", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["dropped"] == 6
    assert [s["__key__"] for s in sf.read_samples(str(tmp_path / "out" / "in.tar"))] == ["s/0000", "s/0003", "s/0006"]


def test_command_job_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "both.py"
    bad.write_text('COMMAND = "true"\ndef process(sample):\n    return sample\n')
    result = run("run", bad, "--inputs", "x.tar", "--outputs", tmp_path / "o.tar")
    assert result.exit_code == 2 and "defines both COMMAND and process()" in result.output
    decoded = tmp_path / "decoded.py"
    decoded.write_text('COMMAND = "true"\nDECODE = "rgb"\n')
    result = run("run", decoded, "--inputs", "x.tar", "--outputs", tmp_path / "o.tar")
    assert result.exit_code == 2 and "remove DECODE" in result.output


def test_shell_job_on_dask(dask_cluster, dask_client, tmp_path):
    spec = text_shard(tmp_path / "in.tar", 6)
    local = sf.ShellJob("rev *.txt > rev.out", spec, str(tmp_path / "a" / "{name}.tar"), parallel=2)
    assert local.run("serial", progress=False).ok
    job = sf.ShellJob("rev *.txt > rev.out", spec, str(tmp_path / "b" / "{name}.tar"), parallel=2)
    report = job.run("dask", address=dask_cluster.address, progress=False)
    assert report.ok, str(report)
    assert digests(tmp_path / "a") == digests(tmp_path / "b")


def test_shell_command_pickles_and_rejects_bad_settings():
    import cloudpickle

    command = ShellCommand("true", parallel=3, timeout=5, env={"A": "1"})
    clone = cloudpickle.loads(cloudpickle.dumps(command))
    assert (clone.command, clone.parallel, clone.timeout, clone.env) == ("true", 3, 5.0, {"A": "1"})
    with pytest.raises(sf.JobError):
        ShellCommand("  ")
    with pytest.raises(sf.JobError):
        sf.ShellJob("true", "x.tar", "y.tar", decode="rgb")


def test_stable_seed_takes_keys_that_are_not_utf8():
    """A tar name with non-UTF-8 bytes gives a key with surrogates; seeding it used to fail the task."""
    from shardflow.task.seeds import stable_seed

    assert stable_seed(0, "\udcff\udcfe") != stable_seed(0, "\udcfe\udcff")
    assert stable_seed(0, "plain") == stable_seed(0, "plain")


def test_a_task_that_stops_early_kills_the_commands_in_flight(tmp_path):
    """A truncated shard (or Ctrl-C) while -p 2 commands run: they are killed at once, not awaited."""

    def truncated():
        for i in range(2):
            yield {"__key__": f"k{i}", "__url__": "u", "txt": b"x"}
        raise sf.FormatError("truncated tar", url="u")

    command = ShellCommand("sleep 30", parallel=2, tmpdir=str(tmp_path))
    started = time.monotonic()
    with pytest.raises(sf.FormatError):
        list(command.arrange_samples(truncated()))
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(tmp_path.iterdir())  # their directories are gone too


def test_default_tmpdir_prefers_a_roomy_ram_disk_unless_tmpdir_is_set(monkeypatch):
    from shardflow.job import shell

    monkeypatch.setenv("TMPDIR", "/somewhere")
    assert shell.default_tmpdir() is None  # tempfile then follows $TMPDIR
    monkeypatch.delenv("TMPDIR")
    shm = Path("/dev/shm")
    expected = "/dev/shm" if shm.is_dir() and os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize >= 1 << 30 else None
    assert shell.default_tmpdir() == expected
    monkeypatch.setattr(shell, "_SHM_FREE", 1 << 62)
    assert shell.default_tmpdir() is None  # a small /dev/shm (Docker's 64 MiB) is not used


def test_sample_directories_a_killed_worker_left_are_swept(tmp_path):
    """A worker killed with SIGKILL never runs its `finally`: its sample directories stayed in /dev/shm
    (RAM) for good. They are named by the pid that made them; the next process sweeps those of dead pids."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    scratch = tmp_path / "scratch"
    (scratch / f"shardflow-sh-{dead.pid}-abc" / "s").mkdir(parents=True)
    (scratch / f"shardflow-sh-{os.getppid()}-live").mkdir()  # a live process's: kept
    (scratch / "shardflow-sh-notapid").mkdir()  # not ours to judge: kept
    spec = text_shard(tmp_path / "in.tar", 1)
    report = sf.ShellJob("true", spec, str(tmp_path / "out" / "{name}.tar"), tmpdir=str(scratch)).run(
        "serial", progress=False)
    assert report.ok
    assert sorted(p.name for p in scratch.iterdir()) == [f"shardflow-sh-{os.getppid()}-live", "shardflow-sh-notapid"]
