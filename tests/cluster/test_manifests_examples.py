"""The checked-in k8s/ and argo/ examples: in sync with the generator, valid, and reproducible by hand."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.cluster.manifests import examples
from tests.cluster.test_manifests_argo import validate_workflow

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("torch")  # jobs/augment.py imports it when loaded


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, str]:
    """Regenerate into a scratch checkout (jobs/ only) and read back what was written."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "jobs", root / "jobs")
    assert examples.main(["--root", str(root)]) == 0
    return {rel: (root / rel).read_text() for rel in examples.render_examples(root)}


def test_examples_match_the_generator(generated):
    stale = [rel for rel, text in generated.items() if not (ROOT / rel).exists() or (ROOT / rel).read_text() != text]
    assert not stale, f"{stale} out of date: run `python -m shardflow.cluster.manifests`"
    assert set(generated) == {"k8s/augment-job.yaml", "k8s/kustomization.yaml", "argo/augment-workflow.yaml"}


def test_check_mode_reports_drift(tmp_path, generated):
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    for rel, text in generated.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert examples.main(["--root", str(tmp_path), "--check"]) == 0
    changed = generated["k8s/augment-job.yaml"].replace("parallelism: 32", "parallelism: 8")
    (tmp_path / "k8s/augment-job.yaml").write_text(changed)
    assert examples.main(["--root", str(tmp_path), "--check"]) == 1


def test_examples_are_valid(generated):
    job = yaml.safe_load(generated["k8s/augment-job.yaml"])
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    assert job["spec"]["completions"] == 256 and job["spec"]["parallelism"] == 32
    validate_workflow(yaml.safe_load(generated["argo/augment-workflow.yaml"]))
    kustomization = yaml.safe_load(generated["k8s/kustomization.yaml"])
    assert all((ROOT / "k8s" / name).exists() for name in kustomization["resources"])
    assert kustomization["images"][0]["name"] == job["spec"]["template"]["spec"]["containers"][0]["image"].split(":")[0]


@pytest.mark.parametrize("rel", ["k8s/augment-job.yaml", "argo/augment-workflow.yaml"])
def test_the_documented_command_reproduces_the_example(rel, generated, monkeypatch):
    text = generated[rel]
    command = next(line for line in text.splitlines() if line.startswith("# Your own: "))[len("# Your own: "):]
    argv = shlex.split(command)
    assert argv[0] == "shardflow"
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, [*argv[1:], "--no-prepare"])
    assert result.exit_code == 0, result.output
    mine, example = yaml.safe_load(result.stdout), yaml.safe_load(text)
    if example["kind"] == "Job":  # yours gets a unique name on every render; the example a fixed one
        assert re.fullmatch(example["metadata"]["name"] + "-[a-z0-9]{5}", mine["metadata"]["name"])
        mine["metadata"]["name"] = example["metadata"]["name"]
    assert mine == example
