"""The README's install path: the wheel `make dist` builds, what it requires, and a clean venv running the demo.

A team installs shardflow from a checkout (`pip install -c constraints.txt ".[s3,dask]"`) or from the
wheel `make dist` writes, never from PyPI (shardflow is not published there). The versions a job.pkl
depends on must agree between that install and the worker image's (docker/install.sh): cloudpickle is
pinned exactly in pyproject, so both resolve to the same one by construction. The slow cases need the
package index (as docker/install.sh's test does) and skip without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower()] = version.strip()
    return pins


def _requirements() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_cloudpickle_is_pinned_exactly_as_the_image_installs_it():
    """job.pkl loads only under the cloudpickle that wrote it (jobrecord.version_mismatch): the library's own
    requirement fixes it, so an install without the constraints file gets the image's version."""
    (pin,) = [r for r in _requirements() if r.startswith("cloudpickle")]
    assert re.fullmatch(r"cloudpickle==[\d.]+", pin), pin
    assert pin.split("==")[1] == _pins()["cloudpickle"]
    assert "constraints.txt" in (ROOT / "docker" / "install.sh").read_text()  # the image installs the same pins


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `make dist` builds (the same pip command), built from a copy: setuptools writes build/ beside
    the sources, and another test run may build at the same time."""
    out, source = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "shardflow", source / "shardflow", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(source)], capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("shardflow-*-py3-none-any.whl")
    return path


def test_wheel_holds_every_module_and_the_pinned_requirements(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "shardflow").rglob("*.py")}
    assert modules <= names, sorted(modules - names)[:5]
    assert "shardflow/jobs_builtin/augment.py" in names and "shardflow/jobs_builtin/resize.py" in names
    dist_info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert f"Requires-Dist: cloudpickle=={_pins()['cloudpickle']}" in metadata
    for extra in ("s3", "gcs", "dask", "torch"):
        assert f"Provides-Extra: {extra}" in metadata
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "shardflow = shardflow.cli:main" in entry_points


def _resolve(*requirement: str, constraints: bool) -> dict[str, str]:
    """name -> version pip would install for `requirement` into an empty environment (pip's --dry-run report)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
               *requirement]
    if constraints:
        command += ["-c", str(ROOT / "constraints.txt")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"pip cannot resolve from the package index here: {done.stderr.strip()[-300:]}")
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_install_and_image_install_agree_on_what_a_pickle_needs(wheel):
    readme = _resolve(f"{wheel}[s3,dask]", constraints=False)  # README: pip install ".[s3,dask]"
    image = _resolve(f"{wheel}[s3,gcs]", constraints=True)  # docker/install.sh: EXTRAS=s3,gcs, -c constraints.txt
    assert readme["cloudpickle"] == image["cloudpickle"] == _pins()["cloudpickle"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_in_a_clean_venv_runs_the_demo_without_torch(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    install = subprocess.run([str(bin_dir / "pip"), "install", "-q", "-c", str(ROOT / "constraints.txt"), str(wheel)],
                             env=env, capture_output=True, text=True, timeout=600)
    if install.returncode and "No matching distribution" in install.stderr:
        pytest.skip(f"the package index is unreachable: {install.stderr.strip()[-300:]}")
    assert install.returncode == 0, install.stderr[-3000:]
    run_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    done = subprocess.run([str(bin_dir / "shardflow"), "demo", "--dir", "demo", "--samples", "8", "--shards", "2",
                           "--workers", "1"], env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch is not installed" in done.stdout and "[torch] extra" in done.stdout
    assert "2/2 tasks done" in done.stdout and "8 in, 8 out" in done.stdout
    assert len(list((tmp_path / "demo" / "resized").glob("*.tar"))) == 2
