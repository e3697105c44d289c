"""A job over shards with members of no sample (a macOS tar's `._*`): every sample written, each stray
member one line in errors/, none a failed sample; and read errors (never raised, no frames) grouped by
their reason, not all under the digest of nothing."""

from __future__ import annotations

import json

import pytest

import shardflow as sf
from shardflow.errors import SampleError, StrayMember
from shardflow.rundir.stats import Stats
from shardflow.task.failures import SampleFailures
from tests.support.tar_corruption import tar_of

MAC = [m for i in range(6) for m in ((f"._s{i}.jpg", b"META"), (f"s{i}.jpg", b"J%d" % i), (f"s{i}.cls", b"%d" % i))]
EMPTY_SHA1 = "da39a3ee5e6b"


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_macos_tar_loses_no_sample(tmp_path, capfd, on_error):
    (tmp_path / "mac.tar").write_bytes(tar_of(MAC))
    job = sf.ShardJob(lambda sample: sample, str(tmp_path / "mac.tar"), str(tmp_path / "out" / "{name}.tar"),
                      run_dir=str(tmp_path / "run"), on_error=on_error)
    report = job.run("serial", progress=False)
    assert report.ok and report.stats.samples_out == 6 and report.stats.failed == 0, report
    lines = [json.loads(x) for x in (tmp_path / "run" / "errors" / "000000.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines] == ["StrayMember"] * 6 and all(x["stage"] == "read" for x in lines)
    assert "'._s5.jpg'" in lines[-1]["reason"] and lines[0]["shard"].endswith("mac.tar")
    assert capfd.readouterr().err.count("belongs to no sample") == 1  # one warning for the shard


def test_a_stray_member_is_no_failed_sample_for_the_rate():
    stats = Stats(samples_in=1)
    failures = SampleFailures(0, stats, "skip", 0.5)
    for name in ("noext", ".hidden.txt"):
        failures.record(StrayMember(f"member {name!r} belongs to no sample"), "d.tar", None, "read")
    failures.check_rate(final=True)  # was "2 sample failures in 1 sample read": the good sample lost
    assert stats.failed == 0 and failures.failed_samples == 0 and len(failures.errors) == 2


def test_errors_never_raised_are_grouped_by_reason():
    failures = SampleFailures(0, Stats(), "skip", 1.0)
    reasons = ["member 'a.txt' is a symbolic link to '/x', not a regular file",
               "member 'b.txt' is a symbolic link to '/y', not a regular file",  # the same reason, other data
               "member 'c.txt' is a hard link to 'a.txt', not a regular file"]
    for index, reason in enumerate(reasons):
        failures.record(SampleError(reason, url="d.tar", offset=512 * index), "d.tar", reason[8], "read")
    failures.record(StrayMember("member 'noext' has no extension"), "d.tar", "noext", "read")
    digests = [e["traceback"] for e in failures.errors]
    assert EMPTY_SHA1 not in digests
    assert digests[0] == digests[1] and len(set(digests)) == 3, digests
