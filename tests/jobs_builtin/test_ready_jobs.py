"""The ready jobs in jobs/: shipped in the package, documented, and doing what their docstrings say."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from PIL import Image

from shardflow.codecs import Decoder
from shardflow.errors import JobError
from shardflow.job.jobfile import BUILTIN_DIR, builtin_jobs, load_job, load_job_file
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from tests.support.jobs import REPO, spec, tars

JOBS = REPO / "jobs"
NAMES = ["augment", "augment_batch", "features", "filter", "reshard", "resize"]


def test_jobs_dir_links_to_the_jobs_shipped_in_the_package():
    # one copy of each job: jobs/*.py are links to the files the wheel ships
    source = sorted(p.name for p in JOBS.glob("*.py"))
    shipped = sorted(p.name for p in BUILTIN_DIR.glob("*.py") if p.name != "__init__.py")
    assert source == shipped == [f"{n}.py" for n in NAMES]
    for name in source:
        assert (JOBS / name).is_symlink() and (JOBS / name).resolve() == (BUILTIN_DIR / name).resolve()
    assert set(NAMES) <= set(builtin_jobs())


@pytest.mark.parametrize("name", NAMES)
def test_each_job_documents_how_to_run_it(name):
    loaded = load_job_file(JOBS / f"{name}.py")
    assert loaded.summary().startswith(f"{name}: ")
    assert f"shardflow run {name} --inputs" in loaded.doc
    for key in loaded.params or {}:
        assert re.search(rf"^\s+{key}\b|[ ,]{key}\b", loaded.doc, re.M), f"PARAMS key {key!r} is not documented"


@pytest.mark.slow
def test_wheel_ships_the_builtin_jobs(tmp_path):
    """Build a wheel from the source, unpack it, and resolve `augment` from it (no checkout around)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "shardflow", src / "shardflow", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("shardflow-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    assert {f"shardflow/jobs_builtin/{n}.py" for n in NAMES} <= names
    code = ("from shardflow.job.jobfile import resolve_job_path, job_summary; "
            "print(resolve_job_path('augment')); print(job_summary('reshard'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    path, summary = done.stdout.splitlines()
    assert path == str(tmp_path / "site" / "shardflow" / "jobs_builtin" / "augment.py")
    assert summary.startswith("reshard: ")


# -- what each job does ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """2 shards x 4 samples of 64x48 JPEG + json (label, index), one 30x80 portrait, one sample without json."""
    directory = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    index = 0
    for shard in range(2):
        with TarWriter(str(directory / f"in-{shard:06d}.tar")) as writer:
            for _ in range(4):
                size = (30, 80) if index == 5 else (64, 48)
                pixels = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, "JPEG", quality=90)
                sample = {"__key__": f"p{index:03d}", "jpg": buf.getvalue()}
                if index != 6:
                    meta = {"src": "a" if index < 4 else "b"}
                    sample["json"] = json.dumps({"label": index % 3, "index": index, "meta": meta}).encode()
                writer.write(sample)
                index += 1
    return directory


def _run(name, photos, out, *settings, backend="serial"):
    from shardflow.job.jobfile import parse_overrides

    job = load_job(name, inputs=spec(photos, "in", 2), outputs=str(out / "{name}.tar"),
                   overrides=parse_overrides(settings))
    report = job.run(backend)
    samples = {s["__key__"]: s for p in tars(out) for s in read_samples(str(p))}
    return report, samples


def test_augment_writes_png_and_cls(photos, tmp_path):
    report, samples = _run("augment", photos, tmp_path / "a", "noise=0", "flip=false")
    assert report.ok and report.stats.skipped == 1 and report.stats.skip_reasons == {"no 'label' in json": 1}
    assert len(samples) == 7
    originals = {s["__key__"]: s for p in sorted(photos.glob("*.tar")) for s in read_samples(str(p))}
    decode = Decoder("rgb8")
    for key, sample in samples.items():
        assert sorted(k for k in sample if not k.startswith("__")) == ["cls", "png"]
        assert int(sample["cls"]) == int(key[1:]) % 3
        # no noise, no flip: [0, 1] floats written back as the very same 8-bit pixels
        png = np.asarray(Image.open(io.BytesIO(sample["png"])))
        assert np.array_equal(png, decode(originals[key])["jpg"])

    _, cropped = _run("augment", photos, tmp_path / "b", "crop=16", "label_key=null")
    assert len(cropped) == 8 and "cls" not in cropped["p006"]
    assert all(Image.open(io.BytesIO(s["png"])).size == (16, 16) for s in cropped.values())


def test_resize_shorter_side_crop_and_quality(photos, tmp_path):
    report, samples = _run("resize", photos, tmp_path / "a", "size=24")
    assert report.ok and len(samples) == 8
    for key, sample in samples.items():
        image = Image.open(io.BytesIO(sample["jpg"]))
        assert image.format == "JPEG" and min(image.size) == 24
        assert image.size == ((24, 64) if key == "p005" else (32, 24))
    originals = {s["__key__"]: s for p in sorted(photos.glob("*.tar")) for s in read_samples(str(p))}
    assert samples["p001"]["json"] == originals["p001"]["json"]  # other entries copied byte for byte

    _, cropped = _run("resize", photos, tmp_path / "b", "size=20", "crop=true", "quality=30")
    assert {Image.open(io.BytesIO(s["jpg"])).size for s in cropped.values()} == {(20, 20)}
    assert sum(len(s["jpg"]) for s in cropped.values()) < sum(len(s["jpg"]) for s in samples.values())

    _, same = _run("resize", photos, tmp_path / "c", "size=500")  # no upscaling by default
    assert Image.open(io.BytesIO(same["p000"]["jpg"])).size == (64, 48)


def test_filter_by_labels_fields_and_image_size(photos, tmp_path):
    report, samples = _run("filter", photos, tmp_path / "a", "labels=[0, 2]")
    assert sorted(samples) == ["p000", "p002", "p003", "p005"]
    assert report.stats.skip_reasons == {"label not allowed": 3, "missing json": 1}
    originals = {s["__key__"]: s for p in sorted(photos.glob("*.tar")) for s in read_samples(str(p))}
    assert all(samples[k]["jpg"] == originals[k]["jpg"] for k in samples)

    report, samples = _run("filter", photos, tmp_path / "b", "where=[\"index >= 2\", \"meta.src == \\\"b\\\"\"]")
    assert sorted(samples) == ["p004", "p005", "p007"]
    assert report.stats.skip_reasons["where: not meta.src == \"b\""] == 2

    report, samples = _run("filter", photos, tmp_path / "c", "min_height=60", "require=json")
    assert sorted(samples) == ["p005"]
    assert report.stats.skip_reasons == {"height < min_height": 6, "missing json": 1}
    _, samples = _run("filter", photos, tmp_path / "d", "max_aspect=2")
    assert "p005" not in samples and len(samples) == 7

    # a malformed condition is no eval and no silent pass: every sample fails, with the reason
    report, samples = _run("filter", photos, tmp_path / "e", "where=__import__('os')")
    assert not report.ok and not samples
    assert "is not 'FIELD OP VALUE'" in next(iter(report.failed.values()))["error"]


def test_reshard_repacks_without_decoding(photos, tmp_path):
    from shardflow.job.jobfile import parse_overrides

    job = load_job("reshard", inputs=spec(photos, "in", 2),
                   outputs=str(tmp_path / "out" / "r-{task:02d}-{part:02d}.tar"),
                   overrides=parse_overrides(["inputs_per_task=2", "maxcount=3"]))
    assert job.decode is None
    report = job.run("serial")
    assert report.ok
    files = tars(tmp_path / "out")
    assert [p.name for p in files] == ["r-00-00.tar", "r-00-01.tar", "r-00-02.tar"]
    assert [sum(1 for _ in read_samples(str(p))) for p in files] == [3, 3, 2]
    originals = [s for p in sorted(photos.glob("*.tar")) for s in read_samples(str(p))]
    copied = [s for p in files for s in read_samples(str(p))]
    assert [{k: v for k, v in s.items() if k != "__url__"} for s in copied] == \
           [{k: v for k, v in s.items() if k != "__url__"} for s in originals]


def test_settings_unknown_to_a_job_are_refused(photos, tmp_path):
    with pytest.raises(JobError, match="PARAMS of resize.py: size, crop, quality, upscale, image_key"):
        load_job("resize", inputs="a.tar", outputs="b.tar", overrides={"width": 3})
    with pytest.raises(JobError, match="reshard.py has no PARAMS"):
        load_job("reshard", inputs="a.tar", outputs="b.tar", overrides={"size": 3})
