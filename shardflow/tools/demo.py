"""`shardflow demo`: a synthetic image dataset, the built-in augment job over it, and a look at the result.

Also the helpers tests and benchmarks use to make shards: `write_synthetic_shards` writes photo-like
JPEG + json samples (deterministic bytes for a given seed), `read_keys` lists the keys of shards.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from shardflow.shards.writer import TarWriter

DEFAULT_SIZE = (512, 384)  # width, height


def photo_like(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """An HWC uint8 image with smooth colour gradients and mild noise (compresses like a photo)."""
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    f = rng.uniform(2.0, 8.0, size=3).astype(np.float32)
    p = rng.uniform(0.0, 6.3, size=3).astype(np.float32)
    base = np.stack([np.sin(f[0] * x + p[0]) + 0 * y, np.cos(f[1] * y + p[1]) + 0 * x,
                     np.sin(f[2] * (x + y) + p[2])], axis=-1)
    noise = rng.normal(0.0, 0.03, size=(height, width, 1)).astype(np.float32)
    image = np.clip(base * 0.4 + 0.5 + noise, 0.0, 1.0)
    return (image * 255.0).astype(np.uint8)


def jpeg_bytes(image: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def synthetic_sample(index: int, *, size: tuple[int, int] = DEFAULT_SIZE, seed: int = 0,
                     classes: int = 10, prefix: str = "sample") -> dict[str, Any]:
    """One sample: `{__key__, jpg, json}` with json `{"label", "width", "height", "index"}`."""
    width, height = size
    rng = np.random.default_rng([seed, index])
    meta = {"label": int(index % classes), "width": width, "height": height, "index": index}
    return {
        "__key__": f"{prefix}{index:06d}",
        "jpg": jpeg_bytes(photo_like(width, height, rng)),
        "json": json.dumps(meta, separators=(",", ":")).encode(),
    }


def write_synthetic_shards(directory: str | os.PathLike[str], shards: int = 4, samples_per_shard: int = 64, *,
                           size: tuple[int, int] = DEFAULT_SIZE, seed: int = 0, name: str = "train",
                           classes: int = 10, distinct: int | None = 32) -> list[str]:
    """Write `shards` tar shards `{name}-000000.tar`... of photo-like JPEG + json samples; returns paths.

    Keys run `sample000000`, `sample000001`... across shards. `distinct` bounds how many different
    images are generated (the rest reuse them, with their own keys and labels), which keeps making
    large datasets fast; None makes every image different. Same arguments, same bytes.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    images: dict[int, bytes] = {}
    paths = []
    index = 0
    for shard in range(shards):
        path = directory / shard_name(name, shard)
        with TarWriter(str(path)) as writer:
            for _ in range(samples_per_shard):
                slot = index if distinct is None else index % distinct
                if slot not in images:
                    images[slot] = synthetic_sample(slot, size=size, seed=seed, classes=classes)["jpg"]
                meta = {"label": int(index % classes), "width": size[0], "height": size[1], "index": index}
                writer.write({"__key__": f"sample{index:06d}", "jpg": images[slot],
                              "json": json.dumps(meta, separators=(",", ":")).encode()})
                index += 1
        paths.append(str(path))
    return paths


def shard_name(name: str, shard: int) -> str:
    """The file name write_synthetic_shards gives shard number `shard`."""
    return f"{name}-{shard:06d}.tar"


def shards_spec(directory: str | os.PathLike[str], shards: int, name: str = "train") -> str:
    """The brace-range input spec of the `shards` shards write_synthetic_shards wrote into `directory`."""
    return str(Path(directory) / f"{name}-{{000000..{shards - 1:06d}}}.tar")


def read_keys(urls: Iterable[str]) -> list[str]:
    """Every sample key in the given shards, in order (raises on a damaged shard)."""
    from shardflow.shards.samples import read_samples

    keys: list[str] = []
    for url in urls:
        keys.extend(sample["__key__"] for sample in read_samples(url))
    return keys


TORCH_MISSING = ("torch is not installed, so the demo runs the built-in resize job (Pillow only) instead of augment; "
                 "the augment job needs the [torch] extra (pip install -c constraints.txt '.[torch]': PyPI's torch "
                 "2.13.0 is the CUDA build, about 4 GB, and runs on the CPU too)")


OUTPUT_FOLDERS = {"augment": "augmented", "resize": "resized"}


def demo_job_name() -> str:
    """augment (torch) where torch can be imported, else resize (Pillow): the demo works on the core install."""
    return "augment" if importlib.util.find_spec("torch") is not None else "resize"


def run_demo(directory: str | os.PathLike[str] = "shardflow-demo", samples: int = 256, workers: int | None = None,
             shards: int = 4, echo: Callable[[str], None] = print, job_name: str | None = None) -> Any:
    """Write the dataset, run a built-in job on it (augment, or resize without torch) with local processes,
    show the result."""
    from shardflow.job.jobfile import load_job

    directory = Path(directory)
    shards = max(1, min(shards, samples))
    per_shard = -(-samples // shards)
    started = time.perf_counter()
    write_synthetic_shards(directory / "input", shards, per_shard)
    width, height = DEFAULT_SIZE
    echo(f"wrote {shards} shards x {per_shard} samples ({width}x{height} JPEG + json label) to {directory / 'input'} "
         f"in {time.perf_counter() - started:.1f} s")
    name = job_name or demo_job_name()
    if name == "resize" and job_name is None:
        echo(TORCH_MISSING)
    in_spec = str(directory / "input" / f"train-{{000000..{shards - 1:06d}}}.tar")
    out_dir = directory / OUTPUT_FOLDERS.get(name, name)
    out_spec = str(out_dir / "{name}.tar")
    job = load_job(name, inputs=in_spec, outputs=out_spec)
    job.prepare(force=True)
    job.rundir().reset()  # the demo always starts over: the inputs were just rewritten
    command = f"shardflow run {name} --inputs '{in_spec}' --outputs '{out_spec}'"
    echo(f"running: {command}" + (f" --workers {workers}" if workers else ""))
    report = job.run("processes", workers=workers)
    echo(str(report))
    for line in _describe_outputs(report.shards, limit=3):
        echo(line)
    echo(f"outputs in {out_dir}, run directory {job.run_dir}")
    echo(f"run it again to see resume: {command}   (every task is already done: nothing is redone)")
    return report


def _describe_outputs(shards: list[dict[str, Any]], limit: int) -> Iterable[str]:
    """A line per output sample (up to `limit`): its shard, key, image size and label."""
    from PIL import Image

    from shardflow.shards.samples import read_samples

    shown = 0
    for shard in shards:
        for sample in read_samples(shard["url"]):
            if shown == limit:
                return
            ext = next((e for e in ("png", "jpg") if e in sample), None)
            if ext is None:
                continue
            image = Image.open(io.BytesIO(sample[ext]))
            label = f"cls {int(sample['cls'])}" if "cls" in sample else f"label {json.loads(sample['json'])['label']}"
            yield (f"  {shard['url'].rsplit('/', 1)[-1]}: key {sample['__key__']}, "
                   f"{ext} {image.width}x{image.height} {image.mode}, {label}")
            shown += 1
