"""Memory of a batched task with its overlap threads: bounded by a few batches, not by the shard.

One 320 MiB shard (320 samples of 1 MiB) through a batched job whose fn is slow: an unbounded read-ahead
would pull the whole shard into memory while fn sleeps. The issue asks for a 2 GB shard; 320 MiB keeps
the test at a few seconds on a shared 2-core machine and shows the same thing (peak RSS well under a
third of the shard, the bound being about five batches of 8 MiB).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shardflow.shards.writer import TarWriter

MIB = 1 << 20

SCRIPT = textwrap.dedent("""
    import resource, sys, time
    import shardflow as sf

    def slow(batch):
        time.sleep(0.05)  # the reader would run far ahead if nothing held it back
        return [{"__key__": s["__key__"], "bin": s["bin"][::-1]} for s in batch]

    if __name__ == "__main__":
        job = sf.ShardJob(slow, sys.argv[1], sys.argv[2], batch_size=8, run_dir=sys.argv[3])
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = job.run("serial", progress=False)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(report.ok, report.stats.samples_out, base * 1024, peak * 1024)
""")


@pytest.mark.slow
def test_rss_is_bounded_by_batches_not_the_shard(tmp_path):
    shard = tmp_path / "big-000000.tar"
    block = bytes(range(256)) * (MIB // 256)
    with TarWriter(str(shard)) as writer:
        for i in range(320):
            writer.write({"__key__": f"k{i:06d}", "bin": block[i:] + block[:i]})
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(shard), str(tmp_path / "out-000000.tar"),
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ok, count, base, peak = proc.stdout.split()
    assert ok == "True" and int(count) == 320
    grown = (int(peak) - int(base)) / MIB
    assert grown < 110, f"peak RSS grew by {grown:.0f} MiB over a 320 MiB shard"
