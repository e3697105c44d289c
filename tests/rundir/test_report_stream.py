"""The run report at scale (issue 28 item 7): summary.json streamed with the bytes json.dumps gives,
report.shards a list-like ShardEntries that refers to per-chunk summaries instead of holding every
entry, and a report of a 20k-task run directory whose peak memory stays well below what holding all
its entries costs; the streamed write publishes whole or not at all, locally and on S3."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.errors import JobError
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.layout import SUMMARY, done_file
from shardflow.rundir.report import build_report
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.summaries import SPAN, Block, summary_name
from shardflow.rundir.summary_json import summary_chunks
from shardflow.storage.atomic import publish_chunks, write_local_atomic
from shardflow.storage.options import redact_urls_deep
from tests.support.jobs import make_shards, spec


def identity(sample):
    return {k: v for k, v in sample.items() if k != "__url__"}


def _old_bytes(obj) -> bytes:
    """What RunDir.write_json wrote for summary.json before it was streamed."""
    return json.dumps(redact_urls_deep(obj), indent=1, sort_keys=True).encode()


# -- the streamed JSON is json.dumps's, byte for byte ----------------------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                     st.text(max_size=12), st.sampled_from(["s3://key:secret@host/b/x.tar", "s3://b/o.tar"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                           inner, max_size=3),
                       max_leaves=8)
_entries = st.lists(st.dictionaries(st.text(max_size=8), _values, max_size=5) | _values, max_size=6)


@settings(max_examples=300, deadline=None)
@given(entries=_entries, head=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "shards"), _values,
                                              max_size=5))
def test_streamed_summary_is_json_dumps_of_the_whole(entries, head):
    assert b"".join(summary_chunks(head, iter(entries))) == _old_bytes({**head, "shards": entries})


def test_a_long_list_comes_in_chunks_of_the_same_bytes():
    entries = [{"url": f"s3://k:s@host/b/out-{i:06d}.tar", "nsamples": i, "nbytes": 3 * i, "sha256": "ab" * 32}
               for i in range(5000)]
    chunks = list(summary_chunks({"tasks": 5000, "ok": True}, entries))
    assert len(chunks) > 2 and b"".join(chunks) == _old_bytes({"tasks": 5000, "ok": True, "shards": entries})
    assert b"secret" not in b"".join(chunks)


# -- a real run: summary.json as before; report.shards reads a summary again --------------------------
def test_a_run_and_its_no_op_resume_write_the_old_summary_bytes(tmp_path):
    make_shards(tmp_path / "in", 12, 2)
    job = ShardJob(identity, spec(tmp_path / "in", "in", 12), f"{tmp_path}/out/{{name}}.tar", maxcount=1)
    first = job.run("serial", progress=False)
    written = (Path(job.run_dir) / SUMMARY).read_bytes()
    assert written == _old_bytes(first.to_json()) and len(first.shards) == 24
    again = job.run("serial", progress=False)  # every task done: entries come from the summary file
    assert again.ok and again.skipped == 12 and again.shards == first.shards and list(again.shards) == \
        json.loads(written)["shards"]
    assert (Path(job.run_dir) / SUMMARY).read_bytes() == _old_bytes(again.to_json())
    shards = again.shards
    assert shards[0] == first.shards[0] and shards[-1] == first.shards[23] and shards[3:7] == first.shards[3:7]
    assert shards[::5] == first.shards[::5] and shards[30:] == [] and shards != first.shards[:-1]
    with pytest.raises(IndexError):
        shards[24]
    RunDir(job.run_dir).reset()  # what --redo does: the summary this report refers to is gone
    with pytest.raises(JobError, match="gone or changed"):
        list(shards)


# -- a 20k-task run directory: the report's memory stays flat -----------------------------------------
N = 20_000


def _entry(t: int) -> dict:
    return {"url": f"s3://bucket/dataset/out/in-{t:06d}.tar", "nsamples": 1, "nbytes": 3072, "sha256": f"{t:064x}"}


def _stats() -> Stats:
    return Stats(samples_in=1, samples_out=1, shards_in=1, shards_out=1, bytes_in=3072, bytes_out=3072)


def _summary(rd: Path, first: int, stop: int) -> None:
    block = Block(first, stop, Stats(), [_entry(t) for t in range(first, stop)])
    for _ in range(first, stop):
        block.stats.merge(_stats())
    (rd / summary_name(first, stop)).write_text(json.dumps(block.to_json(), indent=1, sort_keys=True))


def _realistic_run_dir(tmp_path: Path) -> RunDir:
    """N done tasks the way runs leave them: 1,000-task summaries (a finished driver run) for the first
    half, pods' 10-task summaries for the next quarter, markers alone for the last quarter."""
    job = ShardJob(identity, f"{tmp_path}/in/in-{{000000..{N - 1:06d}}}.tar", f"{tmp_path}/out/{{name}}.tar")
    job.prepare()
    rd = Path(job.run_dir)
    (rd / "summaries").mkdir(exist_ok=True)
    (rd / "done").mkdir(exist_ok=True)
    for first in range(0, N // 2, SPAN):
        _summary(rd, first, first + SPAN)
    for first in range(N // 2, 3 * N // 4, 10):
        _summary(rd, first, first + 10)
    for t in range(3 * N // 4, N):
        (rd / done_file(t)).write_text(json.dumps({"task": t, "stats": _stats().to_json(), "outputs": [_entry(t)]}))
    return RunDir(job.run_dir)


def test_the_report_of_a_20k_task_run_dir_does_not_hold_its_entries(tmp_path):
    rd = _realistic_run_dir(tmp_path)
    for attempt in range(2):  # the first report merges pod summaries and markers into SPAN summaries
        tracemalloc.start()
        report = build_report(rd, range(N), {}, time.perf_counter(), skipped=N)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        tracemalloc.start()
        held = json.loads((Path(rd.path) / SUMMARY).read_bytes())["shards"]  # what the old report held
        holding = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert held == [_entry(t) for t in range(N)]
        assert report.ok and report.done == N and report.stats.samples_in == N and len(report.shards) == N
        assert peak < holding / 2, (attempt, peak, holding)
    names = {f"summaries/{p.name}" for p in Path(rd.path, "summaries").iterdir()}
    assert {summary_name(first, first + SPAN) for first in range(0, N, SPAN)} <= names  # pods' and markers' merged
    assert report.shards == held and report.shards[N - 1] == _entry(N - 1)


# -- the streamed write: whole or not at all ------------------------------------------------------------
def _failing(chunks: int, size: int):
    for _ in range(chunks):
        yield b"x" * size
    raise OSError("the report's summaries became unreadable")


def test_a_failed_local_streamed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "summary.json"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="unreadable"):
        write_local_atomic(str(path), _failing(3, 1000), tag="t")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    write_local_atomic(str(path), iter([b"new ", b"content"]), tag="t")
    assert path.read_bytes() == b"new content"


def test_a_failed_upload_publishes_nothing_on_s3(s3_server, s3_bucket):
    import gc

    import s3fs

    fs = s3fs.S3FileSystem(**s3_server.storage_options, default_block_size=5 * 2**20)
    path = f"{s3_bucket.split('://', 1)[1]}/rd/summary.json"
    for chunks in (1, 3):  # under the PUT threshold, and past a 5 MB part (a multipart upload begun)
        with pytest.raises(OSError, match="unreadable"):
            publish_chunks(fs, path, _failing(chunks, 3 * 2**20), small=2**20)
        gc.collect()  # an fsspec file left open would commit in __del__
        fs.invalidate_cache()
        assert not fs.exists(path)
    publish_chunks(fs, path, (bytes([65 + i]) * 2**20 for i in range(7)), small=2**20)
    fs.invalidate_cache()
    assert fs.cat_file(path) == b"".join(bytes([65 + i]) * 2**20 for i in range(7))
    publish_chunks(fs, path, iter([b"small"]))  # one PUT
    assert fs.cat_file(path) == b"small"
