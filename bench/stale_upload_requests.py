"""Requests a run makes to S3 with and without the abort of stale multipart uploads (storage.stale_uploads).

A job of N tiny tasks writes one shard each to `s3://<bucket>/<folder>/`, serially in this process
(every API call of the s3fs client the tasks share is counted, uploads' PUTs included). Three runs
into fresh folders: the code as shipped on a clean folder; then on folders holding K uploads that
killed attempts of K of the tasks left open, once with the s3 record's `open_uploads` switched off
(the code before) and once as shipped. Printed: each run's S3 requests by operation and the uploads
still open in its folder after it.

Usage:
  .venv/bin/python bench/stale_upload_requests.py                 # starts SeaweedFS (tests/support/s3.py)
  .venv/bin/python bench/stale_upload_requests.py --tasks 500 --stale 20
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _copy(sample):
    return {"__key__": sample["__key__"], "bin": sample["bin"]}


def _run(server, bucket: str, folder: str, tasks: int, run_dir: str) -> collections.Counter:
    import fsspec
    from fsspec.asyn import sync

    import shardflow as sf

    options = server.storage_options
    shared = fsspec.filesystem("s3", **options)  # the cached instance the tasks use
    client = sync(shared.loop, shared.set_session)
    calls: collections.Counter = collections.Counter()

    def count(model, **_):  # every API call the client makes (s3fs's own, uploads' PUTs too)
        calls[model.name] += 1

    client.meta.events.register("before-call.s3", count)
    try:
        job = sf.ShardJob(_copy, inputs=f"s3://{bucket}/src/in-{{000000..{tasks - 1:06d}}}.tar",
                          outputs=f"s3://{bucket}/{folder}/{{name}}.tar", run_dir=run_dir, storage_options=options)
        report = job.run("serial")
        assert report.ok and report.done == tasks, report
    finally:
        client.meta.events.unregister("before-call.s3", count)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--stale", type=int, default=10, help="uploads left open by killed attempts")
    args = parser.parse_args()

    from shardflow.storage import protocols
    from tests.support.processes import _find_executable
    from tests.support.s3 import S3Server
    from tests.support.storage_samples import write_shard

    work = Path(tempfile.mkdtemp(prefix="sf-stale-"))
    server = S3Server(work, _find_executable("weed"))
    server.start()
    try:
        bucket = "stale-bench"
        server.make_bucket(bucket)
        client = server.boto3_client()
        for i in range(args.tasks):
            write_shard(f"s3://{bucket}/src/in-{i:06d}.tar", [{"__key__": f"k{i}", "bin": b"x" * 100}],
                        server.storage_options)
        shipped = protocols.PROTOCOLS["s3"]
        runs = []
        before = dataclasses.replace(shipped, open_uploads=None)
        for label, folder, record in [("shipped, clean folder", "a", shipped),
                                      (f"before (no abort), {args.stale} stale", "b", before),
                                      (f"shipped, {args.stale} stale uploads", "c", shipped)]:
            if folder != "a":
                for i in range(args.stale):
                    client.create_multipart_upload(Bucket=bucket, Key=f"{folder}/in-{i * 7 % args.tasks:06d}.tar")
            protocols.register_protocol(record, clobber=True)
            try:
                calls = _run(server, bucket, folder, args.tasks, str(work / f"run-{folder}"))
            finally:
                protocols.register_protocol(shipped, clobber=True)
            left = client.list_multipart_uploads(Bucket=bucket, Prefix=f"{folder}/").get("Uploads") or []
            runs.append((label, calls, len(left)))
        methods = sorted({m for _, calls, _ in runs for m in calls})
        print(f"{args.tasks} tasks, serial, one process")
        print(f"{'run':34s} {'total':>6s} " + " ".join(f"{m:>22s}" for m in methods) + "  open after")
        for label, calls, left in runs:
            print(f"{label:34s} {sum(calls.values()):6d} " + " ".join(f"{calls[m]:22d}" for m in methods)
                  + f"  {left:10d}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
