"""`status` and the report's numbers on S3 cost O(tasks / 1,000) requests, in the states a run leaves:
mid-run with the summaries of thousands of pods, none of which they open (each used to cost a GET)."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from shardflow.job.shard_job import ShardJob
from shardflow.rundir.layout import RECORDS, RUNNING, done_file
from shardflow.rundir.records import DONE, TaskRecord, running_name
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.stats import Stats
from shardflow.rundir.status import read_status
from shardflow.rundir.summaries import Block, summary_name

pytestmark = pytest.mark.slow

N, POD = 2_100, 3  # 700 pod summaries; three listing prefixes per folder


class Requests:
    """Requests the s3fs client sends, by kind: LIST, GET (an object), PUT, HEAD, ..."""

    def __init__(self, fs) -> None:
        self.counts: Counter = Counter()
        fs.connect()
        fs.s3.meta.events.register("before-send.s3", self._count)

    def _count(self, request=None, **_) -> None:
        listing = request.method == "GET" and "list-type=2" in request.url
        self.counts["LIST" if listing else request.method] += 1

    def take(self) -> Counter:
        counts, self.counts = self.counts, Counter()
        return counts


def _build(rd: RunDir, done: int) -> None:
    """`done` tasks finished by pods of POD tasks (markers, records, each pod's summary), 3 running."""
    files: dict[str, bytes] = {}
    stats = Stats(samples_in=4, samples_out=4, shards_in=1, shards_out=1, bytes_in=4096, bytes_out=4096)
    for t in range(done):
        record = TaskRecord(t, DONE, 1, time.time() - 600 + t * 0.1, 0.2, 0.1, f"pod-{t // POD}~p1", stats=stats)
        outputs = [{"url": f"out/{t:06d}.tar", "nsamples": 4, "nbytes": 4096, "sha256": "0" * 64}]
        files[f"{rd.path}/{done_file(t)}"] = json.dumps({"task": t, "inputs": [f"in-{t:06d}.tar"], "outputs": outputs,
                                                         "stats": stats.to_json(), "record": record.to_json()}).encode()
        files[f"{rd.path}/{RECORDS}/{record.name()}"] = b""
    for first in range(0, done, POD):
        block = Block(first, first + POD, Stats().merge(stats).merge(stats).merge(stats),
                      [{"url": f"out/{t:06d}.tar"} for t in range(first, first + POD)])
        files[f"{rd.path}/{summary_name(first, first + POD)}"] = json.dumps(block.to_json()).encode()
    for t in range(done, done + 3):
        files[f"{rd.path}/{RUNNING}/{running_name(t, time.time() - 30, f'pod-{t // POD}~p1')}"] = b""
    rd.fs.pipe(files)


def test_status_and_report_numbers_mid_run_cost_listings_not_a_get_per_pod(s3_server, s3_bucket):
    from shardflow.tools.report_data import collect

    options = s3_server.storage_options
    job = ShardJob(lambda s: s, f"{s3_bucket}/in/in-{{000000..{N - 1:06d}}}.tar", f"{s3_bucket}/out/{{name}}.tar",
                   storage_options=options)
    job.prepare(overwrite=True)
    rd = RunDir(job.run_dir, options)
    done = N - 99
    _build(rd, done)
    requests = Requests(rd.fs._fs)  # under the retrying wrapper
    requests.take()

    status = read_status(job.run_dir, options, run_dir=rd)
    counts = requests.take()
    assert len(status.done) == done and status.stats.samples_in == 4 * done
    assert sorted(r.task for r in status.tally.running) == [done, done + 1, done + 2]
    assert "running task" in str(status) and "ETA" in str(status)
    # done/ and records/: 3 prefix listings each (1,000 ids a request, concurrently); summaries/, failed/,
    # errors/, running/: 1 each; plan.json and last_run.json: 2 GETs. Before: a GET per pod summary (700).
    # The 3 running tasks' beats (rundir.beats): a GET each, at most BEATS_READ. lease.json: 1 GET (is a
    # driver still there: rundir.status.driver_gone).
    assert counts["GET"] <= 3 + 3 + 1 and counts["LIST"] <= 12 and sum(counts.values()) <= 19, counts

    data = collect(job.run_dir, options, run_dir=rd)
    counts = requests.take()
    assert data["summary"]["done"] == done and data["summary"]["running"] == 3
    # the status above, job.json, the plan's reads for the slowest tasks' inputs
    assert counts["LIST"] >= 8 and sum(counts.values()) <= 30, counts
