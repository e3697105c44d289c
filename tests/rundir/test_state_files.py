"""Run-directory files that cannot be read back: one line naming the file and what to do
(rundir.state_files); summaries, which the done markers rebuild, read as missing instead."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.errors import RunStateError
from shardflow.job.shard_job import ShardJob
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.state_files import loads, what_to_do
from tests.support.jobs import make_shards


@given(st.binary(max_size=64) | st.text(st.characters(exclude_categories=("Cs",)), max_size=64).map(str.encode))
@settings(max_examples=300, deadline=None)
def test_any_bytes_parse_or_fail_as_one_line_naming_the_file(data):
    try:
        value = loads(data, "s3://b/run/done/000007.json")
    except RunStateError as exc:
        message = str(exc)
        assert message.startswith("s3://b/run/done/000007.json cannot be read (") and "\n" not in message
        assert "that task runs again" in message
    else:
        assert json.dumps(value) == json.dumps(json.loads(data))  # (NaN parses, and is not equal to itself)


@pytest.mark.parametrize("where, says", [
    ("/r/_shardflow/plan.json", "--redo"),
    ("/r/_shardflow/plan/chunk-000003.json", "--redo"),
    ("/r/_shardflow/done/000003.json", "that task runs again"),
    ("/r/_shardflow/failed/000003.json", "only records why"),
    ("/r/_shardflow/summary.json", "a rerun writes it again"),
    ("/r/_shardflow/job.json", "prepare the run again"),
])
def test_each_file_says_what_to_do(where, says):
    assert says in what_to_do(where)


def passthrough(sample):
    return {"__key__": sample["__key__"], "json": sample["json"]}


def test_an_unreadable_summary_reads_as_missing(tmp_path):
    make_shards(tmp_path / "in", 3, 4)
    job = ShardJob(passthrough, str(tmp_path / "in" / "in-{000000..000002}.tar"), f"{tmp_path}/out/{{name}}.tar")
    assert job.run("serial", progress=False).ok
    (summary,) = (tmp_path / "out" / "_shardflow" / "summaries").iterdir()
    summary.write_bytes(b'{"stats": {"samples_out": 1')  # truncated by hand
    again = job.run("serial", progress=False)  # the report merges the done markers instead
    assert again.ok and again.skipped == 3 and again.stats.samples_out == 12


def test_read_json_names_the_file(tmp_path):
    (tmp_path / "last_run.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(RunStateError, match=f"{tmp_path}/last_run.json cannot be read .*a rerun writes it again"):
        RunDir(str(tmp_path)).read_json("last_run.json")
