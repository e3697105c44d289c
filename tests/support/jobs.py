"""Helpers for the job tests (test_job*.py, test_jobs.py, test_ready_jobs.py); no tests here.

Everything is real: shards are written with shardflow's TarWriter, job files are real files,
`shardflow` runs as a real subprocess (python -m shardflow.cli), damage is real bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from PIL import Image

from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from shardflow.storage.atomic import TEMP_MARK

REPO = Path(__file__).resolve().parents[2]


def tiny_jpeg(index: int, size: tuple[int, int] = (32, 24)) -> bytes:
    rng = np.random.default_rng(index)
    pixels = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def decoded_alike(a: Any, b: Any) -> bool:
    """Two decodes of one JPEG (uint8 tensors, any device) as close as two decoders give: nvjpeg and libjpeg
    round the IDCT and the chroma upsampling a little differently, so under 3 grey levels apart on average."""
    return bool((a.cpu().int() - b.cpu().int()).abs().float().mean().item() < 3.0)


def make_shards(directory: Path, shards: int, per_shard: int, *, name: str = "in",
                bad: Iterable[str] = (), size: tuple[int, int] = (32, 24), start: int = 0) -> list[str]:
    """Shards `{name}-000000.tar`... of samples `s000000`... with jpg + json {"label", "index"}.

    Keys listed in `bad` get bytes that are not an image (their decode fails).
    """
    bad = set(bad)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    index = start
    for shard in range(shards):
        path = directory / f"{name}-{shard:06d}.tar"
        with TarWriter(str(path)) as writer:
            for _ in range(per_shard):
                key = f"s{index:06d}"
                jpg = b"this is not a jpeg" if key in bad else tiny_jpeg(index, size)
                meta = {"label": index % 5, "index": index}
                writer.write({"__key__": key, "jpg": jpg, "json": json.dumps(meta).encode()})
                index += 1
        paths.append(str(path))
    return paths


def spec(directory: Path, name: str, count: int) -> str:
    return str(directory / f"{name}-{{000000..{count - 1:06d}}}.tar")


def write_job(directory: Path, body: str, name: str = "job.py") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def serial_job_setup(tmp_path: Path, body: str, job_name: str, shards: int, per_shard: int,
                     ) -> tuple[Path, Path, list[str], Path]:
    """A job file and `shards` input shards under tmp_path, and the `shardflow run JOB` arguments that run
    it serially into tmp_path/out: (tmp_path, job file, args, the default run directory)."""
    make_shards(tmp_path / "in", shards, per_shard)
    job = write_job(tmp_path, body, job_name)
    out = tmp_path / "out"
    args = ["--inputs", spec(tmp_path / "in", "in", shards), "--outputs", str(out / "{name}.tar"), "-b", "serial"]
    return tmp_path, job, args, out / "_shardflow"


def sha256_file(path: Path) -> str:
    """The sha256 of a file, as a shard's receipt gives it."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tars(directory: Path) -> list[Path]:
    """Final (non-temp) tar files under a directory, sorted."""
    return sorted(p for p in directory.rglob("*.tar") if TEMP_MARK not in p.name)


def temp_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if TEMP_MARK in p.name)


def keys_in(paths: Iterable[Any]) -> Counter:
    counts: Counter = Counter()
    for path in paths:
        counts.update(sample["__key__"] for sample in read_samples(str(path)))
    return counts


def file_bytes(paths: Iterable[Path]) -> dict[str, bytes]:
    return {Path(p).name: Path(p).read_bytes() for p in paths}


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("SHARDFLOW_ALLOW_PIPE", None)
    return env


def cli(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `shardflow ARGS...` in a subprocess; returns the completed process (text output)."""
    return subprocess.run([sys.executable, "-m", "shardflow.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(), cwd=cwd)


def cli_popen(*args: str, **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardflow.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), **kwargs)


def errors_logged(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run_dir / "errors").glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return out
