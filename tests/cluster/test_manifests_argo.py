"""`shardflow argo` / `job.to_argo`: the Workflow parses into Argo's models and retries the right things."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from click.testing import CliRunner
from hera.workflows.models import Workflow

from shardflow.cli import main
from shardflow.cluster.manifests import ClusterOptions, manifest, render_options
from shardflow.cluster.manifests.argo import FINALIZE_RETRY_EXPRESSION, RETRY_EXPRESSION
from shardflow.job.jobfile import load_job
from tests.support.k8s import argo_expression, make_shards, write_job_file


def workflow_for(**kw) -> dict:
    options = dict(image="registry.example/shardflow:0.1", run_dir="gs://b/run", tasks=100, name="augment")
    options.update(kw)
    return manifest(ClusterOptions(**options), "argo")


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}" for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def validate_workflow(data: dict) -> Workflow:
    """Parse into hera's Argo models; a field they do not know (a typo) is dropped, which the round trip shows."""
    model = Workflow.model_validate(data)
    back = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert not _differences(data, back), _differences(data, back)
    return model


@pytest.mark.parametrize("kw", [
    {},
    dict(namespace="argo", parallelism=3, tasks_per_pod=7, secrets=("s3",), env={"A": "b"}, service_account="wf",
         image_pull_secrets=("reg",), node_selector={"pool": "cpu"}, pvcs=(("c", "/data"),), retries=0, deadline=60,
         storage_options=("client_kwargs.endpoint_url=http://minio:9000",)),
    dict(tasks=1_000_000),
])
def test_workflow_parses_into_argo_models(kw):
    model = validate_workflow(workflow_for(**kw))
    assert model.kind == "Workflow" and model.api_version == "argoproj.io/v1alpha1"


def test_validation_is_able_to_fail():
    data = workflow_for()
    data["spec"]["templates"][1]["retryStrategy"]["limitt"] = "3"
    with pytest.raises(AssertionError):
        validate_workflow(data)
    data = workflow_for()
    data["spec"]["templates"][1]["container"]["resources"] = "lots"
    with pytest.raises(pydantic.ValidationError):
        validate_workflow(data)


def test_fan_out_is_a_sequence_not_a_list():
    data = workflow_for(tasks=100_000, parallelism=64)
    main_template = data["spec"]["templates"][0]
    (fan_out,), (summary,) = main_template["steps"]
    assert fan_out["withSequence"] == {"count": "2000"}  # auto: 50 tasks per item
    assert "withItems" not in fan_out and "withParam" not in fan_out
    assert fan_out["continueOn"] == {"failed": True, "error": True}
    assert main_template["parallelism"] == 64
    text = render_options(ClusterOptions("img:1", "gs://b/run", 100_000), "argo")
    assert len(text.encode()) < 10_000  # far under etcd's object limit whatever the shard count
    templates = {t["name"]: t for t in data["spec"]["templates"]}
    chunk = templates[fan_out["template"]]
    assert chunk["container"]["args"] == [
        "worker", "--run-dir", "gs://b/run", "--tasks-per-index", "50", "--index", "{{inputs.parameters.index}}"]
    assert fan_out["arguments"]["parameters"] == [{"name": "index", "value": "{{item}}"}]
    finalize = templates[summary["template"]]
    assert finalize["container"]["args"] == ["worker", "--run-dir", "gs://b/run", "--finalize"]


def test_retry_strategy_backs_off_and_skips_bad_input():
    templates = {t["name"]: t for t in workflow_for(retries=4)["spec"]["templates"]}
    for name in ("chunk", "finalize"):
        strategy = templates[name]["retryStrategy"]
        assert strategy["retryPolicy"] in ("Always", "OnFailure", "OnError", "OnTransientError")
        assert strategy["limit"] == "4"
        assert set(strategy["backoff"]) == {"duration", "factor"}  # no maxDuration: see test_manifests_argo_retries.py
    assert templates["chunk"]["retryStrategy"]["expression"] == RETRY_EXPRESSION
    assert templates["finalize"]["retryStrategy"]["expression"] == FINALIZE_RETRY_EXPRESSION

    def retried(expression: str, status: str, code: int | str) -> bool:
        return argo_expression(expression, status, str(code))

    assert not retried(RETRY_EXPRESSION, "Failed", 65)  # bad input
    assert not retried(RETRY_EXPRESSION, "Failed", 78)  # fatal for the run
    assert retried(RETRY_EXPRESSION, "Failed", 75)  # transient
    assert retried(RETRY_EXPRESSION, "Failed", 137)  # killed (OOM, lost node)
    assert retried(RETRY_EXPRESSION, "Error", "")  # pod deleted / evicted: no exit code at all
    assert retried(FINALIZE_RETRY_EXPRESSION, "Failed", 75)
    assert not retried(FINALIZE_RETRY_EXPRESSION, "Failed", 65)  # the run is incomplete: retrying changes nothing


def test_cleanup_and_security():
    spec = workflow_for()["spec"]
    assert spec["podGC"]["strategy"] in ("OnPodCompletion", "OnPodSuccess", "OnWorkflowCompletion", "OnWorkflowSuccess")
    assert spec["ttlStrategy"]["secondsAfterCompletion"] == 86400
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    for template in spec["templates"][1:]:
        sc = template["container"]["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"] == {"drop": ["ALL"]}


def test_cli_and_python_api_agree(tmp_path: Path):
    make_shards(tmp_path / "in", 5, 2)
    path = write_job_file(tmp_path)
    inputs, outputs = str(tmp_path / "in" / "in-{000000..000004}.tar"), f"{tmp_path}/out/{{name}}.tar"
    cli = CliRunner().invoke(main, ["argo", str(path), "--inputs", inputs, "--outputs", outputs, "--image", "img:1",
                                    "--pvc", f"data:{tmp_path}",
                                    "--parallelism", "2", "--secret", "creds", "--namespace", "argo"])
    assert cli.exit_code == 0, cli.output
    validate_workflow(yaml.safe_load(cli.stdout))
    job = load_job(path, inputs=inputs, outputs=outputs)
    assert job.to_argo("img:1", parallelism=2, secrets=["creds"], namespace="argo",
                       pvcs=[("data", str(tmp_path))]) == cli.stdout
