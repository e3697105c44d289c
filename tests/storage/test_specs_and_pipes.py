"""Shard specs (braces, globs, lists), opening URLs, and `pipe:` safety and failure handling."""

from __future__ import annotations

import os
import time

import fsspec
import psutil
import pytest

from shardflow.errors import FormatError, PipeError, ShardIOError
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter
from shardflow.storage.pipes import PIPE_ENV
from shardflow.storage.schemes import open_read
from shardflow.storage.specs import expand


def write_shard(path, n=5, size=100, prefix="k"):
    with TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}{i:04d}", "bin": bytes([i % 256]) * size})
    return str(path)


def keys(samples):
    return [s["__key__"] for s in samples]


# ------------------------------------------------------------------------------------------------
# expand


def test_brace_expansion_with_several_groups_keeps_order():
    got = expand("s3://b/{train,val}/x-{000..002}.tar")
    assert got == [f"s3://b/{split}/x-{i:03d}.tar" for split in ("train", "val") for i in range(3)]
    assert expand("d/{a,b}{1..2}.tar") == ["d/a1.tar", "d/a2.tar", "d/b1.tar", "d/b2.tar"]


def test_list_of_specs_keeps_order():
    assert expand(["z.tar", "a-{0..1}.tar", "m.tar"]) == ["z.tar", "a-0.tar", "a-1.tar", "m.tar"]
    assert expand(("x.tar",)) == ["x.tar"]


def test_globs_are_sorted_and_combined_with_braces(tmp_path):
    for name in ["b-2.tar", "a-10.tar", "a-1.tar", "b-1.tar", "c.txt"]:
        (tmp_path / name).write_bytes(b"")
    d = str(tmp_path)
    assert expand(f"{d}/*.tar") == [f"{d}/{n}" for n in ["a-1.tar", "a-10.tar", "b-1.tar", "b-2.tar"]]
    assert expand(f"{d}/a-?.tar") == [f"{d}/a-1.tar"]
    assert expand(f"{d}/{{b,a}}-[12].tar") == [f"{d}/b-1.tar", f"{d}/b-2.tar", f"{d}/a-1.tar"]
    assert expand(f"file://{d}/b-*.tar") == [f"file://{d}/b-1.tar", f"file://{d}/b-2.tar"]


def test_globs_skip_hidden_files_such_as_writer_temps(tmp_path):
    (tmp_path / "a-0.tar").write_bytes(b"")
    w = TarWriter(str(tmp_path / "a-1.tar"))  # in progress: only its hidden temp exists
    w.write({"__key__": "k", "txt": b"x"})
    try:
        assert expand(f"{tmp_path}/*") == [f"{tmp_path}/a-0.tar"]
    finally:
        w.abort()


def test_memory_glob():
    fs = fsspec.filesystem("memory")
    for i in (2, 0, 1):
        fs.pipe(f"/sf-urls-glob/s-{i}.tar", b"")
    try:
        got = expand("memory://sf-urls-glob/s-*.tar")
        assert [u.replace(":///", "://") for u in got] == [f"memory://sf-urls-glob/s-{i}.tar" for i in range(3)]
        assert [len(list(fsspec.open(u).open().read())) for u in got] == [0, 0, 0]
    finally:
        fs.rm("/sf-urls-glob", recursive=True)


def test_empty_specs_are_errors(tmp_path):
    with pytest.raises(ShardIOError, match="matched no shards"):
        expand(f"{tmp_path}/nothing-*.tar")
    with pytest.raises(ShardIOError, match="names no shards"):
        expand([])


def test_s3_glob_and_braces(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    for name in ["g/t-1.tar", "g/t-0.tar", "g/t-2.tar", "g/v-0.tar", "g/sub/t-9.tar"]:
        fs.pipe(f"{s3_bucket}/{name}", b"x")
    opts = s3_server.storage_options
    assert expand(f"{s3_bucket}/g/t-*.tar", opts) == [f"{s3_bucket}/g/t-{i}.tar" for i in range(3)]
    assert expand(f"{s3_bucket}/g/{{v,t}}-0.tar", opts) == [f"{s3_bucket}/g/v-0.tar", f"{s3_bucket}/g/t-0.tar"]


# ------------------------------------------------------------------------------------------------
# open_read


def test_missing_files_and_directories_name_the_url(tmp_path):
    with pytest.raises(ShardIOError) as info:
        open_read(str(tmp_path / "missing.tar"))
    assert str(tmp_path / "missing.tar") in str(info.value)
    with pytest.raises(ShardIOError) as info:
        open_read(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_missing_s3_object_is_a_shard_io_error(s3_server, s3_bucket):
    with pytest.raises(ShardIOError) as info:
        list(read_samples(f"{s3_bucket}/nope.tar", storage_options=s3_server.storage_options))
    assert f"{s3_bucket}/nope.tar" in str(info.value)
    assert s3_server.secret not in str(info.value)


# ------------------------------------------------------------------------------------------------
# pipe:


def test_pipe_is_refused_unless_allowed(tmp_path, monkeypatch):
    shard = write_shard(tmp_path / "p.tar")
    marker = tmp_path / "ran"
    url = f"pipe:touch {marker}; cat {shard}"
    monkeypatch.delenv(PIPE_ENV, raising=False)
    with pytest.raises(PipeError, match="off by default"):
        open_read(url)
    with pytest.raises(PipeError):
        list(read_samples(url))
    monkeypatch.setenv(PIPE_ENV, "0")
    with pytest.raises(PipeError):
        list(read_samples(url))
    assert not marker.exists(), "a refused pipe: must not run anything"
    assert keys(read_samples(url, allow_pipe=True)) == [f"k{i:04d}" for i in range(5)]
    assert marker.exists()
    monkeypatch.setenv(PIPE_ENV, "1")
    assert len(list(read_samples(url))) == 5
    with pytest.raises(PipeError):
        list(read_samples(url, allow_pipe=False))  # an explicit False wins over the environment


def test_pipe_gzip(tmp_path):
    shard = write_shard(tmp_path / "p.tar")
    assert len(list(read_samples(f"pipe:gzip -c {shard}", allow_pipe=True))) == 5


def test_failing_pipe_command_is_an_error_not_a_short_shard(tmp_path):
    shard = write_shard(tmp_path / "p.tar", n=50, size=3000)
    with pytest.raises(PipeError) as info:
        list(read_samples(f"pipe:cat {tmp_path}/missing.tar", allow_pipe=True))
    assert "status 1" in str(info.value) and "missing.tar" in str(info.value)
    # a complete archive from a command that then fails is still a failure
    with pytest.raises(PipeError, match="status 3"):
        list(read_samples(f"pipe:cat {shard}; exit 3", allow_pipe=True))
    # a cut-off stream from a failing command: the command's failure is what is reported
    with pytest.raises(PipeError, match="status 2"):
        list(read_samples(f"pipe:head -c 20000 {shard}; exit 2", allow_pipe=True))
    # a cut-off stream from a "successful" command is still not a short shard
    with pytest.raises(FormatError, match="truncated"):
        list(read_samples(f"pipe:head -c 20000 {shard}", allow_pipe=True))


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.05)
    return alive


def test_pipe_subprocess_is_reaped_when_the_reader_stops_early(tmp_path):
    shard = write_shard(tmp_path / "p.tar", n=200, size=20_000)  # 4 MB: more than the pipe holds
    before = _descendants()
    it = read_samples(f"pipe:cat {shard}", allow_pipe=True)
    assert next(it)["__key__"] == "k0000"
    started = _descendants() - before
    assert started, "the command should be running while the shard is read"
    it.close()  # the reader stops after one sample
    assert _wait_gone(started) == set()
    assert _descendants() - before == set()


def test_endless_pipe_command_is_stopped_after_the_archive_ends(tmp_path):
    shard = write_shard(tmp_path / "p.tar", n=20, size=20_000)
    before = _descendants()
    t0 = time.monotonic()
    # after the end marker a plain stream is read on for at most 1 MiB (looking for damage), then
    # left: the endless zeros are ignored, no error (endless concatenated archives would be one)
    got = keys(read_samples(f"pipe:cat {shard}; cat /dev/zero", allow_pipe=True))
    assert got == [f"k{i:04d}" for i in range(20)]
    assert time.monotonic() - t0 < 30
    assert _wait_gone(_descendants() - before) == set()


def test_pipe_stream_closed_by_hand(tmp_path):
    shard = write_shard(tmp_path / "p.tar", n=100, size=50_000)
    before = _descendants()
    stream = open_read(f"pipe:cat {shard}", allow_pipe=True)
    head = stream.read(1000)
    assert len(head) == 1000
    started = _descendants() - before
    assert started
    stream.close()
    stream.close()  # idempotent
    assert _wait_gone(started) == set()


# ------------------------------------------------------------------------------------------------
# local, memory and S3 round trips through the public functions


def test_memory_round_trip():
    with ShardWriter("memory://sf-urls-rt/s-%02d.tar", maxcount=3) as w:
        for i in range(7):
            w.write({"__key__": f"m{i}", "txt": b"%d" % i})
    try:
        got = [s for u in expand("memory://sf-urls-rt/s-*.tar") for s in read_samples(u)]
        assert keys(got) == [f"m{i}" for i in range(7)]
    finally:
        fsspec.filesystem("memory").rm("/sf-urls-rt", recursive=True)


def test_s3_spec_round_trip(s3_server, s3_bucket):
    opts = s3_server.storage_options
    with ShardWriter(f"{s3_bucket}/rt/part-%03d.tar", maxcount=4, storage_options=opts) as w:
        for i in range(10):
            w.write({"__key__": f"s{i:03d}", "bin": os.urandom(1000), "cls": b"%d" % i})
    spec = f"{s3_bucket}/rt/part-{{000..002}}.tar"
    assert expand(spec) == [f"{s3_bucket}/rt/part-{i:03d}.tar" for i in range(3)]
    got = [s for u in expand(f"{s3_bucket}/rt/part-*.tar", opts) for s in read_samples(u, storage_options=opts)]
    assert keys(got) == [f"s{i:03d}" for i in range(10)]
    assert [s["cls"] for s in got] == [b"%d" % i for i in range(10)]


def test_stdin_stream(tmp_path):
    import subprocess
    import sys

    shard = write_shard(tmp_path / "p.tar")
    code = "import shardflow as sf; print(len(list(sf.read_samples('-'))))"
    with open(shard, "rb") as f:
        out = subprocess.run([sys.executable, "-c", code], stdin=f, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


@pytest.mark.parametrize("scheme", ["file://", "local://"])
def test_local_url_schemes_round_trip(tmp_path, monkeypatch, scheme):
    """`local://` is fsspec's other name for local files: written and read at the path it names (it was
    read as a missing file and written into a folder named `local:` in the working directory)."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out" / "x.tar"
    url = f"{scheme}{target}"
    with TarWriter(url) as writer:
        writer.write({"__key__": "a", "txt": b"hello"})
    assert target.is_file() and not (tmp_path / "local:").exists()
    assert [s["txt"] for s in read_samples(open_read(url), url)] == [b"hello"]
