"""`shardflow preview`: a job's process() on its first samples, in this process, writing no shards.

For each input sample it shows what process() returned: the output keys, each value's type, shape and
dtype (arrays, tensors, images) and the size it would have once encoded by the job's encoder; an
exception is shown with its traceback (file and line) and the preview goes on. Images can be drawn
as a contact sheet PNG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from shardflow.rundir.tracebacks import format_trace, printable
from shardflow.shards.samples import read_samples
from shardflow.storage.schemes import open_read
from shardflow.storage.specs import expand
from shardflow.task.process import as_outputs
from shardflow.task.seeds import job_seed, seed_globals, stable_seed

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

IMAGE_EXTENSIONS = {"png", "jpg", "jpeg", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif"}
Outcome = tuple[str, "list[dict[str, Any]] | BaseException"]


def _first_samples(job: "ShardJob", count: int) -> Iterator[dict[str, Any]]:
    inputs = job.inputs
    urls = expand(inputs, job.options_for(inputs if isinstance(inputs, str) else inputs[0]))
    for url in urls:
        stream = open_read(url, job.options_for(url), allow_pipe=job.allow_pipe)
        try:
            for sample in read_samples(stream, url):
                yield sample
                count -= 1
                if count <= 0:
                    return
        finally:
            stream.close()


def preview_samples(job: "ShardJob", count: int) -> list[Outcome]:
    """(input key, outputs or the exception process() raised) for the first `count` input samples."""
    decoder = job.make_decoder()
    out: list[Outcome] = []
    with job_seed(job.seed):
        for sample in _first_samples(job, count):
            key = sample["__key__"]
            try:
                decoded = decoder(sample) if decoder is not None else sample
                seed_globals(stable_seed(job.seed, key))
                out.append((key, as_outputs(job.fn(decoded), key)))
            except Exception as exc:  # noqa: BLE001 - shown with its traceback, the preview goes on
                out.append((key, exc))
    return out


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f" shape {tuple(shape)} {getattr(value, 'dtype', '')}".rstrip()
    size = getattr(value, "size", None)
    if type(value).__module__.startswith("PIL") and size is not None:
        return f" size {size} mode {getattr(value, 'mode', '?')}"
    if isinstance(value, (bytes, str, list, dict)):
        return f" len {len(value)}"
    return ""


def describe(outcomes: list[Outcome], encoder: Any = None) -> list[str]:
    """Lines that say what process() returned for each sample."""
    from shardflow.codecs import Encoder

    encoder = encoder or Encoder()
    lines: list[str] = []
    for key, result in outcomes:
        if isinstance(result, BaseException):
            lines.append(f"sample {key!r}: process raised {type(result).__name__}: {result}")
            lines.extend("    " + line for line in format_trace(result).splitlines())
            continue
        lines.append(f"sample {key!r}: {len(result)} output(s)" if result else f"sample {key!r}: dropped (None)")
        for output in result:
            try:
                encoded = encoder(output)
            except Exception as exc:  # noqa: BLE001 - shown, not fatal
                encoded, error = {}, f" (encode fails: {type(exc).__name__}: {exc})"
            else:
                error = ""
            lines.append(f"  {output['__key__']!r}{error}")
            for ext, value in output.items():
                if ext.startswith("__"):
                    continue
                size = f", {len(encoded[ext])} bytes encoded" if isinstance(encoded.get(ext), bytes) else ""
                lines.append(f"    {ext}: {type(value).__module__}.{type(value).__qualname__}{_shape(value)}{size}")
    return [printable(line) for line in lines]


def _as_image(value: Any) -> Any:
    """A PIL image for an image-like value (PIL, HWC/CHW uint8 or float array, tensor), else None."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) not in (2, 3) or 0 in tuple(shape):
        return None
    import numpy as np

    array = np.asarray(value)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[2] not in (1, 3):
        array = array.transpose(1, 2, 0)  # CHW -> HWC
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 3 and array.shape[2] != 3:
        return None
    if array.dtype != np.uint8:
        array = (np.clip(array.astype("float32"), 0, 1) * 255).round().astype(np.uint8)
    return Image.fromarray(array).convert("RGB")


def write_sheet(outputs: list[Any], path: str, *, cell: int = 160, columns: int = 6) -> int:
    """Draw every image among the outputs into one PNG contact sheet, each with its output key and label
    under it (tools.sheet: the layout of `shardflow show`); returns how many (0: nothing written)."""
    from shardflow.tools.sheet import Tile, png_bytes, render

    tiles = []
    for result in outputs:
        for output in result if isinstance(result, list) else []:
            found = [(ext, _as_image(value)) for ext, value in output.items()
                     if ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS]
            found = [(ext, image) for ext, image in found if image is not None]
            for ext, image in found:
                key = str(output.get("__key__", "?")) + (f" .{ext}" if len(found) > 1 else "")
                tiles.append(Tile(key, output_label(output), ext, image))
    if not tiles:
        return 0
    with open(path, "wb") as f:
        f.write(png_bytes(render(tiles, columns, cell)))
    return len(tiles)


def output_label(output: dict[str, Any]) -> str:
    """The label shown under an output's image, as `show` picks it: `cls`, else `json["label"]`."""
    value = output.get("cls")
    if value is None and isinstance(output.get("json"), dict):
        value = output["json"].get("label")
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace").strip()
    return "" if value is None else str(value)
