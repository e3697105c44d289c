"""The designed public surface of `shardflow` (shardflow/__init__.py): what users call, nothing internal,
and a light `import shardflow` (the job layer and the torch reader load on first use)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import tomllib

import shardflow as sf
import shardflow.version

ROOT = Path(__file__).resolve().parents[1]

USER_NAMES = {
    "ShardJob", "ShellJob", "load_job", "RunReport", "ShardDataset", "Loader", "TarWriter", "ShardWriter",
    "RecordWriter", "ShardInfo", "read_samples", "iter_samples", "load_spec", "sample_rng", "sample_seed",
    "device_rng", "worker_device", "register_codec", "Decoder", "Encoder", "__version__", "ShardflowError",
    "FormatError", "SampleError", "DecodeError", "EncodeError", "ShardIOError", "PipeError", "JobError",
    "SkipSample", "ShardflowWarning", "JobSpec", "running_spec",
}
INTERNALS = ("Task", "run_task", "RunDir", "iter_members")


def test_every_exported_name_resolves_and_the_user_names_are_there():
    assert USER_NAMES <= set(sf.__all__)
    assert len(sf.__all__) == len(set(sf.__all__))
    for name in sf.__all__:
        assert getattr(sf, name) is not None, name
    assert set(sf.__all__) <= set(dir(sf))


def test_internals_are_not_exported():
    for name in INTERNALS:
        assert name not in sf.__all__
        assert not hasattr(sf, name), name


def test_the_lazy_names_are_the_objects_of_their_modules():
    from shardflow.job.jobfile import load_job
    from shardflow.job.shard_job import ShardJob
    from shardflow.rundir.report import RunReport
    from shardflow.task.seeds import sample_rng

    assert (sf.ShardJob, sf.load_job, sf.RunReport, sf.sample_rng) == (ShardJob, load_job, RunReport, sample_rng)


def test_version_has_one_home_that_imports_nothing():
    assert sf.__version__ == shardflow.version.__version__
    assert sf.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    tree = ast.parse((ROOT / "shardflow" / "version.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    inside = [line for path in (ROOT / "shardflow").rglob("*.py") for line in path.read_text().splitlines()
              if "from shardflow import __version__" in line]
    assert inside == []  # the package reads shardflow.version, never its own front door


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_shardflow_stays_light():
    """A worker that only re-shards never pays for torch, the job layer or the reader."""
    loaded = _modules_after("import shardflow")
    heavy = {"torch", "torchvision", "shardflow.job", "shardflow.reader", "shardflow.task", "shardflow.rundir",
             "shardflow.backends", "shardflow.cluster", "shardflow.cli", "shardflow.tools", "dask", "distributed"}
    assert not heavy & loaded, sorted(heavy & loaded)
    assert "shardflow.job.shard_job" in _modules_after("import shardflow\nshardflow.ShardJob")
