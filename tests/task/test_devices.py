"""Devices (task/devices.py, codecs/gpu.py, backends): GPU slots per worker, the one-line error without
CUDA, device="auto" falling back to the CPU, Dask worker resources, nvidia.com/gpu in manifests.

The tests that need a GPU are in tests/task/test_cuda_jobs.py (core imports only, so a GPU machine
runs them without this module's manifest validators: bench/device_check.sh).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from hera.workflows.models import Workflow

import shardflow as sf
from shardflow.cli import main
from shardflow.codecs.gpu import cuda_available, encode_on_device, make_decoder
from shardflow.errors import JobError
from shardflow.shards.samples import read_samples
from shardflow.task.devices import gpu_plan, visible_gpus
from tests.support.jobs import file_bytes, make_shards, spec, tars, write_job
from tests.support.k8s import write_job_file


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("in")
    make_shards(directory, 2, 5, bad=["s000003"])
    return directory


def _flip(batch):
    return [{"__key__": s["__key__"], "png": s["jpg"].flip(-1)} for s in batch]


def _job(shards, out, **kwargs):
    return sf.ShardJob(_flip, spec(shards, "in", 2), str(out / "{name}.tar"), run_dir=str(out / "run"), **kwargs)


@pytest.mark.skipif(cuda_available(), reason="checks the machine without CUDA")
def test_without_cuda_one_line_error_and_the_run_stops(shards, tmp_path):
    for name, settings in {"a": dict(decode="torchrgb8-cuda"), "b": dict(decode="torchrgb8", device="cuda")}.items():
        report = _job(shards, tmp_path / name, batch_size=4, **settings).run("serial", progress=False)
        assert report.done == 0 and len(report.failed) == 1  # the first task failed, the run stopped there
        failed = json.loads((tmp_path / name / "run" / "failed" / "000000.json").read_text())
        assert failed["kind"] == "user" and "\n" not in failed["error"]
        assert "needs a CUDA GPU" in failed["error"] and "device='auto'" in failed["error"]


def test_auto_falls_back_to_the_cpu_with_the_same_bytes(shards, tmp_path):
    """decode="torchrgb8-cuda" with device="auto" on a machine without a GPU decodes on the CPU: the same
    values as "torchrgb8", so the same shards; per-sample decode failures are still logged per key."""
    if cuda_available():
        pytest.skip("checks the CPU fallback")
    cpu = _job(shards, tmp_path / "cpu", decode="torchrgb8", batch_size=4).run("serial", progress=False)
    auto = _job(shards, tmp_path / "auto", decode="torchrgb8-cuda", device="auto", batch_size=4).run(
        "serial", progress=False)
    assert cpu.ok and auto.ok and auto.stats.failed == 1 and auto.stats.samples_out == 9
    assert file_bytes(tars(tmp_path / "cpu")) == file_bytes(tars(tmp_path / "auto"))
    assert sf.worker_device() == "cpu"


def test_decoder_specs_and_settings_are_checked():
    with pytest.raises(ValueError, match="torchrgb8-cuda"):
        make_decoder("rgb8-cuda")
    with warnings.catch_warnings():  # the reader's old spelling: an alias of -cuda (its warning: codecs tests)
        warnings.simplefilter("ignore", DeprecationWarning)
        assert type(make_decoder("torchrgb8-gpu")).__name__ == "GpuJpegDecoder"
    with pytest.raises(JobError, match="device must be one of"):
        sf.ShardJob(_flip, "a.tar", "b.tar", device="gpu")
    job = sf.ShardJob(_flip, "a.tar", "b.tar", batch_size=8, device="cuda")
    assert {k: job.settings()[k] for k in ("batch_size", "collate", "device")} == {
        "batch_size": 8, "collate": False, "device": "cuda"}
    assert "batch_size" not in sf.ShardJob(_flip, "a.tar", "b.tar").settings()  # old plans keep their fingerprint


def test_gpu_slots(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    assert visible_gpus() == ["0", "1", "2", "3", "4"]
    assert gpu_plan("cuda", None).slots == ("0", "1", "2", "3", "4")
    assert gpu_plan(None, 2).slots == ("0,1", "2,3")
    assert gpu_plan(None, None) is None and gpu_plan("cpu", None) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_plan("auto", None) is None  # no GPU here: a CPU run
    with pytest.raises(JobError, match="0 GPU"):
        gpu_plan("cuda", None)
    with pytest.raises(JobError, match="--gpus-per-worker 1"):
        gpu_plan("auto", 1)


def test_processes_pins_one_gpu_slot_per_worker(tmp_path, monkeypatch):
    """Each worker gets its own CUDA_VISIBLE_DEVICES (the slots of gpus_per_worker), one worker per slot."""
    make_shards(tmp_path / "in", 6, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7,9")
    path = write_job(tmp_path, """
        import os

        def process(sample):
            return {"__key__": sample["__key__"], "txt": os.environ["CUDA_VISIBLE_DEVICES"] + f"@{os.getpid()}"}
    """)
    from shardflow.job.jobfile import load_job

    job = load_job(path, inputs=spec(tmp_path / "in", "in", 6), outputs=str(tmp_path / "out" / "{name}.tar"))
    assert job.run("processes", gpus_per_worker=1, progress=False).ok
    seen = {s["txt"].decode() for p in tars(tmp_path / "out") for s in read_samples(str(p))}
    slots = {text.split("@")[0] for text in seen}
    assert slots <= {"4", "7", "9"}
    pids_per_slot = {}
    for text in seen:
        slot, pid = text.split("@")
        pids_per_slot.setdefault(slot, set()).add(pid)
    assert all(len(pids) == 1 for pids in pids_per_slot.values())  # a slot belongs to one worker


def test_encode_on_device_leaves_cpu_values_alone():
    import torch

    samples = [{"__key__": "a", "jpg": torch.zeros(3, 4, 4, dtype=torch.uint8), "cls": 1}]
    assert encode_on_device(samples, 90) is samples


def test_dask_refuses_gpu_tasks_no_worker_can_take(shards, tmp_path, dask_cluster, dask_client):
    job = _job(shards, tmp_path / "o", batch_size=4)
    with pytest.raises(JobError, match="--resources GPU=1"):
        job.run("dask", address=dask_cluster.address, gpus_per_worker=1, progress=False)


@pytest.mark.parametrize("kind", ["k8s", "argo"])
def test_manifests_carry_the_gpu_limit(tmp_path: Path, kind):
    from tests.support.k8s import make_shards as make_k8s_shards

    make_k8s_shards(tmp_path / "in", 2, 2)
    args = [kind, str(write_job_file(tmp_path)), "--inputs", str(tmp_path / "in" / "in-{000000..000001}.tar"),
            "--outputs", f"{tmp_path}/out/{{name}}.tar", "--image", "img:1", "--gpus", "2",
            "--pvc", f"data:{tmp_path}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.stdout)
    if kind == "k8s":
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        container = doc["spec"]["template"]["spec"]["containers"][0]
    else:
        Workflow.model_validate(doc)
        container = next(t["container"] for t in doc["spec"]["templates"] if "container" in t)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    plain = CliRunner().invoke(main, [a for a in args if a not in ("--gpus", "2")] + ["--force"])
    assert "nvidia.com/gpu" not in plain.stdout


def test_docker_cuda_build_arg_installs_the_cuda_wheels():
    """docker/install.sh with CUDA=<tag> (the Dockerfile's build arg): torch from PyTorch's CUDA index."""
    import subprocess

    from tests.support.jobs import REPO

    env = {**os.environ, "PIP": "echo pip", "CUDA": "cu128", "EXTRAS": "s3"}
    out = subprocess.run(["sh", str(REPO / "docker" / "install.sh"), str(REPO)], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "--extra-index-url https://download.pytorch.org/whl/cu128 torch==" in out and "[s3,torch]" in out
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert 'ARG CUDA=""' in dockerfile and 'CUDA="${CUDA}" sh docker/install.sh' in dockerfile


def test_batched_jpeg_decode_and_its_fallbacks_on_the_cpu(tmp_path):
    """GpuJpegDecoder's batching and fallbacks, run with torchvision's CPU decode_jpeg in place of nvjpeg:
    JPEGs of a batch in one call, a PNG decoded by the CPU spec, a broken JPEG failing alone (with its
    key, the batch call failing first and each JPEG retried alone), a CMYK JPEG decoded either way."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    from tests.support.jobs import tiny_jpeg

    def encoded(fmt, mode="RGB"):
        buf = io.BytesIO()
        Image.fromarray(np.full((6, 8, 3), 120, np.uint8)).convert(mode).save(buf, fmt)
        return buf.getvalue()

    samples = [{"__key__": "a", "jpg": tiny_jpeg(1), "cls": b"3"}, {"__key__": "b", "png": encoded("PNG")},
               {"__key__": "c", "jpg": b"\xff\xd8 not really"}, {"__key__": "d", "jpg": encoded("JPEG", "CMYK")},
               {"__key__": "e", "jpg": tiny_jpeg(2)}]
    decoder = make_decoder("torchrgb8-cuda", device="auto")
    decoder._on_gpu, decoder.device = True, "cpu"
    out = decoder.decode_batch(samples)
    cpu = make_decoder("torchrgb8")
    for i in (0, 4):
        assert torch.equal(out[i]["jpg"], cpu(samples[i])["jpg"]) and out[i]["jpg"].dtype == torch.uint8
    assert out[0]["cls"] == 3 and tuple(out[1]["png"].shape) == (3, 6, 8)
    assert isinstance(out[2], Exception) and getattr(out[2], "key", None) == "c"
    assert tuple(out[3]["jpg"].shape) == (3, 6, 8)
    floats = make_decoder("torchrgb-cuda", device="auto")
    floats._on_gpu, floats.device = True, "cpu"
    assert floats.decode_batch(samples[:1])[0]["jpg"].dtype == torch.float32


def test_cli_gpus_per_worker_without_gpus_is_a_one_line_start_error(shards, tmp_path):
    path = write_job(tmp_path, """
        def process(sample):
            return sample
    """)
    env = {"CUDA_VISIBLE_DEVICES": ""}
    result = CliRunner().invoke(main, ["run", str(path), "--inputs", spec(shards, "in", 2), "--outputs",
                                       str(tmp_path / "o" / "{name}.tar"), "--gpus-per-worker", "1"], env=env)
    assert result.exit_code == 2, result.output
    assert "--gpus-per-worker 1: 0 GPU(s) visible" in result.output and "Traceback" not in result.output


def test_gpu_jpeg_pixels_round_like_the_cpu_encoder():
    """Floats become uint8 before the GPU JPEG encode exactly as the CPU encoder rounds them."""
    import numpy as np
    import torch

    from shardflow.codecs.gpu import _uint8
    from shardflow.codecs.images import _float_to_uint8

    values = torch.tensor([[[-0.4 / 255, 0.0, 0.5 / 255, 1.5 / 255, 0.5, 1.0, 1 + 0.4 / 255, float("nan")]]])
    assert _uint8(values, torch).numpy().tolist() == _float_to_uint8(values.numpy().copy()).tolist()
    assert _uint8(torch.ones(1, 2, 2, dtype=torch.uint8), torch).dtype == torch.uint8
    assert np.array_equal(_uint8(values, torch).numpy()[0, 0, :2], [0, 0])
    for outside in (torch.tensor([[[0.2, 1.7]]]), torch.tensor([[[-0.5, 0.5]]])):  # forgot /255; [-1, 1] data
        with pytest.raises(ValueError, match=r"float pixels must be in \[0, 1\]") as gpu_error:
            _uint8(outside, torch)
        with pytest.raises(ValueError) as cpu_error:
            _float_to_uint8(outside.numpy().copy())
        assert str(gpu_error.value) == str(cpu_error.value)
