"""Run every benchmark in turn (`make bench`); each writes its own figures to stdout.

The benchmarks are separate scripts so that one area can be measured alone:
    bench_io.py      shard read + rewrite vs webdataset and cat (issue: foundation)
    bench_jobs.py    jobs/augment.py vs the webdataset + dask.delayed recipe, and framework overhead
    bench_dask.py    Dask backend vs processes vs the recipe, scheduler overhead per task
    bench_s3.py      S3 -> S3 streaming vs plain s3fs, peak RSS and local disk writes
    bench_reader.py  ShardDataset vs webdataset's WebLoader vs the pure decode limit
    bench_codecs.py  codec speeds (simplejpeg vs Pillow, PNG levels)
Pass names to run some: `python bench/run.py io reader`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALL = ("io", "jobs", "dask", "s3", "reader", "codecs")


def main(names: list[str]) -> int:
    status = 0
    for name in names or ALL:
        script = HERE / f"bench_{name}.py"
        print(f"== {script.name}", flush=True)
        status |= subprocess.call([sys.executable, str(script)])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
