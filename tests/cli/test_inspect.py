"""`shardflow ls / cat / stats`: output, one-line errors with a non-zero exit, storage options."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.shards.writer import ShardWriter, TarWriter


def run(*args, input=None):
    result = CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)
    return result


def cli(*args, input=None, env=None, timeout=120):
    """The installed `shardflow` command in a real subprocess."""
    exe = shutil.which("shardflow", path=os.path.dirname(sys.executable)) or shutil.which("shardflow")
    cmd = [exe] if exe else [sys.executable, "-m", "shardflow.cli"]
    return subprocess.run([*cmd, *map(str, args)], input=input, capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def one_line_error(stderr: str | bytes) -> str:
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert "Traceback" not in text
    assert len(lines) == 1, text
    assert lines[0].startswith("shardflow: error: ")
    return lines[0]


@pytest.fixture
def shards(tmp_path):
    """3 shards of 4 samples: cls + jpg (+ json on even samples)."""
    samples = []
    for i in range(12):
        s = {"__key__": f"img/{i:05d}", "cls": b"%d" % (i % 3), "jpg": bytes([i]) * (1000 + i)}
        if i % 2 == 0:
            s["json"] = json.dumps({"i": i}).encode()
        samples.append(s)
    with ShardWriter(str(tmp_path / "d-%03d.tar"), maxcount=4) as w:
        for s in samples:
            w.write(s)
    return tmp_path, samples, w.shards


# ------------------------------------------------------------------------------------------------
# ls


def test_ls_lists_samples_extensions_sizes(shards):
    tmp_path, samples, infos = shards
    result = run("ls", infos[0].url)
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "img/00000\tcls:1 jpg:1000 json:8",
        "img/00001\tcls:1 jpg:1001",
        "img/00002\tcls:1 jpg:1002 json:8",
        "img/00003\tcls:1 jpg:1003",
    ]
    assert "4 samples" in result.stderr


def test_ls_spec_and_json(shards):
    tmp_path, samples, infos = shards
    result = run("ls", str(tmp_path / "d-{000..002}.tar"), "--json")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["key"] for r in rows] == [s["__key__"] for s in samples]
    assert rows[5] == {"shard": infos[1].url, "key": "img/00005", "members": {"cls": 1, "jpg": 1005}}
    text = run("ls", str(tmp_path / "d-*.tar")).stdout.splitlines()
    assert text[0] == f"# {infos[0].url}" and text[5] == f"# {infos[1].url}" and len(text) == 15


# ------------------------------------------------------------------------------------------------
# cat


def test_cat_writes_member_bytes(shards):
    tmp_path, samples, infos = shards
    result = run("cat", infos[1].url, "--key", "img/00006", "--ext", "jpg")
    assert result.exit_code == 0 and result.stdout_bytes == samples[6]["jpg"]
    both = run("cat", infos[1].url, "--key", "img/00006")
    assert both.stdout_bytes == samples[6]["cls"] + samples[6]["jpg"] + samples[6]["json"]
    every_cls = run("cat", infos[2].url, "--ext", "cls")
    assert every_cls.stdout_bytes == b"".join(s["cls"] for s in samples[8:12])
    several = run("cat", infos[0].url, "-k", "img/00003", "-k", "img/00001", "-e", "cls", "-e", ".JPG")
    assert several.stdout_bytes == samples[1]["cls"] + samples[1]["jpg"] + samples[3]["cls"] + samples[3]["jpg"]


def test_cat_missing_key_or_extension_is_an_error(shards):
    tmp_path, samples, infos = shards
    missing = cli("cat", infos[0].url, "--key", "img/99999")
    assert missing.returncode == 1 and missing.stdout == b""
    line = one_line_error(missing.stderr)
    assert "img/99999" in line and infos[0].url in line
    no_ext = cli("cat", infos[0].url, "--key", "img/00001", "--ext", "json")
    assert no_ext.returncode == 1
    assert "json" in one_line_error(no_ext.stderr)


def test_cat_stops_reading_once_the_key_is_found(tmp_path):
    shard = tmp_path / "p.tar"
    with TarWriter(str(shard)) as w:
        for i in range(50):
            w.write({"__key__": f"k{i:03d}", "bin": os.urandom(50_000)})
    # the command sends the 2.5 MB shard, then idles for 60 s: reading to the end of the archive
    # would mean waiting for the command to exit; stopping early stops (and reaps) it at once
    t0 = time.monotonic()
    result = cli("cat", f"pipe:cat {shard}; sleep 60", "--allow-pipe", "--key", "k002", "--ext", "bin", timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) == 50_000
    assert time.monotonic() - t0 < 30


# ------------------------------------------------------------------------------------------------
# stats


def test_stats_totals_over_a_spec(shards):
    tmp_path, samples, infos = shards
    result = run("stats", str(tmp_path / "d-{000..002}.tar"), "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    data_bytes = sum(len(v) for s in samples for k, v in s.items() if not k.startswith("__"))
    assert got["shards"] == 3 and got["samples"] == 12 and got["members"] == 30
    assert got["data_bytes"] == data_bytes
    assert got["stored_bytes"] == sum(i.nbytes for i in infos)
    total = sum(1000 + i for i in range(12))
    assert got["extensions"]["jpg"] == {"count": 12, "bytes": total, "min": 1000, "max": 1011}
    assert got["extensions"]["json"]["count"] == 6 and got["bad_shards"] == 0
    text = run("stats", str(tmp_path / "d-*.tar")).stdout
    assert "samples       12" in text and "jpg" in text and "json" in text


def test_stats_many_shards_gzip_and_threads(tmp_path):
    n = 40
    for k in range(n):
        with TarWriter(str(tmp_path / f"s-{k:03d}.tar")) as w:
            for i in range(5):
                w.write({"__key__": f"{k}/{i}", "txt": b"x" * (k + i)})
        raw = (tmp_path / f"s-{k:03d}.tar").read_bytes()
        if k % 2:
            (tmp_path / f"s-{k:03d}.tar").unlink()
            (tmp_path / f"s-{k:03d}.tar.gz").write_bytes(gzip.compress(raw))
    spec = [str(tmp_path / "s-*.tar"), str(tmp_path / "s-*.tar.gz")]
    got = json.loads(run("stats", *spec, "--json", "-j", "8").stdout)
    assert got["shards"] == n and got["samples"] == 5 * n
    assert got["data_bytes"] == sum(k + i for k in range(n) for i in range(5))
    stored = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert got["stored_bytes"] == stored
    assert got == json.loads(run("stats", *spec, "--json", "-j", "1").stdout)


def test_stats_bad_shard_fails_or_is_skipped(shards):
    tmp_path, samples, infos = shards
    data = bytearray(open(infos[1].url, "rb").read())
    (tmp_path / "d-001.tar").write_bytes(bytes(data[:3000]))  # truncated
    spec = str(tmp_path / "d-{000..002}.tar")
    failed = cli("stats", spec)
    assert failed.returncode == 1
    line = one_line_error(failed.stderr)
    assert "d-001.tar" in line and "truncated" in line and "offset" in line
    skipped = cli("stats", spec, "--on-error", "skip", "--json")
    assert skipped.returncode == 0
    got = json.loads(skipped.stdout)
    assert got["shards"] == 3 and got["bad_shards"] == 1 and got["samples"] == 8
    assert b"d-001.tar" in skipped.stderr and b"Traceback" not in skipped.stderr


def test_ls_skip_goes_on_after_an_unreadable_shard_as_stats_does(shards):
    """`ls --on-error skip` ("warn on stderr and go on") stopped at the first shard it could not read to
    its end, with exit 1: the shards after it were never listed."""
    tmp_path, samples, infos = shards
    (tmp_path / "d-001.tar").write_bytes(open(infos[1].url, "rb").read()[:3000])  # truncated
    spec = str(tmp_path / "d-{000..002}.tar")
    assert cli("ls", spec).returncode == 1
    skipped = cli("ls", spec, "--on-error", "skip")
    assert skipped.returncode == 0, skipped.stderr
    assert b"# " + str(tmp_path / "d-002.tar").encode() in skipped.stdout
    assert b"d-001.tar" in skipped.stderr and b"1 unreadable" in skipped.stderr and b"Traceback" not in skipped.stderr
    listed = [line for line in skipped.stdout.splitlines() if line and not line.startswith(b"#")]
    assert len(listed) == json.loads(cli("stats", spec, "--on-error", "skip", "--json").stdout)["samples"]


def test_stats_skip_reports_bad_samples_and_counts_good_ones(tmp_path):
    with TarWriter(str(tmp_path / "dup.tar")) as w:
        w.write({"__key__": "a", "txt": b"1"})
        w.write({"__key__": "b", "txt": b"2"})
    raw = (tmp_path / "dup.tar").read_bytes()
    # a key that reappears later: members a, b, a
    (tmp_path / "re.tar").write_bytes(raw[:-1024] + raw[:1024] + bytes(1024))
    result = cli("stats", str(tmp_path / "re.tar"), "--on-error", "skip", "--json")
    assert result.returncode == 0
    got = json.loads(result.stdout)
    assert got["samples"] == 2 and got["problems"] == 1
    assert b"key reappears later" in result.stderr


# ------------------------------------------------------------------------------------------------
# errors: one clear line, non-zero exit


@pytest.mark.parametrize("what", ["not-a-tar", "missing", "empty", "truncated", "corrupt-gzip", "directory"])
def test_errors_are_one_line(tmp_path, what):
    good = tmp_path / "good.tar"
    with TarWriter(str(good)) as w:
        for i in range(20):
            w.write({"__key__": f"k{i}", "bin": os.urandom(2000)})
    target = tmp_path / f"{what}.tar"
    if what == "not-a-tar":
        target.write_text("just some text\n" * 100)
    elif what == "empty":
        target.write_bytes(b"")
    elif what == "truncated":
        target.write_bytes(good.read_bytes()[:20_000])
    elif what == "corrupt-gzip":
        gz = bytearray(gzip.compress(good.read_bytes()))
        gz[len(gz) // 2 : len(gz) // 2 + 8] = b"\xff" * 8
        target.write_bytes(bytes(gz))
    elif what == "directory":
        target.mkdir()
    for command in ("ls", "stats", "cat"):
        result = cli(command, target)
        assert result.returncode == 1, (command, result)
        line = one_line_error(result.stderr)
        assert str(target) in line
        if what in ("not-a-tar", "truncated", "corrupt-gzip"):
            assert "offset" in line


def test_pipe_needs_allow_pipe(tmp_path):
    result = cli("ls", "pipe:echo hi")
    assert result.returncode == 1 and "off by default" in one_line_error(result.stderr)


def test_bad_storage_option_is_a_usage_error(shards):
    tmp_path, samples, infos = shards
    result = cli("ls", infos[0].url, "--storage-option", "no-equals-sign")
    assert result.returncode == 2 and b"KEY=VALUE" in result.stderr and b"Traceback" not in result.stderr


def test_stdin_and_broken_stdout(tmp_path):
    shard = tmp_path / "s.tar"
    with TarWriter(str(shard)) as w:
        for i in range(20_000):
            w.write({"__key__": f"k{i:05d}", "txt": b"x"})
    result = cli("stats", "-", "--json", input=shard.read_bytes())
    assert result.returncode == 0 and json.loads(result.stdout)["samples"] == 20_000
    exe = shutil.which("shardflow", path=os.path.dirname(sys.executable))
    piped = subprocess.run(f"'{exe}' ls '{shard}' | head -n 2", shell=True, capture_output=True, timeout=60,
                           executable="/bin/bash")
    assert piped.stdout.decode().splitlines() == ["k00000\ttxt:1", "k00001\ttxt:1"]
    assert b"Traceback" not in piped.stderr and b"Broken pipe" not in piped.stderr


# ------------------------------------------------------------------------------------------------
# storage options against the real S3-compatible server


def test_storage_options_with_s3(s3_server, s3_bucket, shards):
    tmp_path, samples, infos = shards
    fs = s3_server.filesystem()
    for info in infos:
        fs.put_file(info.url, f"{s3_bucket}/cli/{os.path.basename(info.url)}")
    opts = ["-S", f"key={s3_server.key}", "-S", f"secret={s3_server.secret}",
            "-S", f"client_kwargs.endpoint_url={s3_server.endpoint_url}"]
    clean_env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_ENDPOINT_URL": ""}
    listed = cli("ls", f"{s3_bucket}/cli/d-000.tar", *opts, env=clean_env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.decode().splitlines()[1] == "img/00001\tcls:1 jpg:1001"
    stats = cli("stats", f"{s3_bucket}/cli/d-*.tar", "--json", *opts, env=clean_env)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["samples"] == 12
    cat_opts = ["-S" if o == "-o" else o for o in opts]  # cat's -o is its output (shell tools, issue 13)
    cat = cli("cat", f"{s3_bucket}/cli/d-002.tar", "-k", "img/00009", "-e", "jpg", *cat_opts, env=clean_env)
    assert cat.stdout == samples[9]["jpg"]
    # a wrong secret: one line, and the secret it was given is not printed
    wrong = ["-S", f"key={s3_server.key}", "-S", "secret=WRONG-secret-value-123",
             "-S", f"client_kwargs.endpoint_url={s3_server.endpoint_url}"]
    denied = cli("ls", f"{s3_bucket}/cli/d-000.tar", *wrong, env=clean_env)
    assert denied.returncode == 1
    line = one_line_error(denied.stderr)
    assert "WRONG-secret-value-123" not in line and f"{s3_bucket}/cli/d-000.tar" in line
