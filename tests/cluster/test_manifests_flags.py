"""Platform flags of `shardflow k8s/argo` (scheduling, labels, secrets as files, threads, unique names,
the run's fingerprint) validated with kubernetes-validate --strict and hera; local run dirs refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.cluster.manifests.extras import cpu_threads, parse_toleration
from shardflow.errors import JobError
from tests.cluster.test_manifests_argo import validate_workflow
from tests.support.k8s import make_shards, write_job_file

K8S = kubernetes_validate.latest_version()
FLAGS = [
    "--toleration", "nvidia.com/gpu=present:NoSchedule", "--toleration", "spot:NoExecute", "--toleration", "dedicated",
    "--node-selector", "pool=cpu", "--priority-class", "batch-low",
    "--label", "team=ml", "--label", "example.com/cost=x1",
    "--annotation", "cluster-autoscaler.kubernetes.io/safe-to-evict=true", "--annotation", "owner=data team",
    "--secret-file", "gcs-key:/var/run/secrets/gcs", "--service-account", "shardflow-runner", "--cpu", "4",
]


@pytest.fixture
def args(tmp_path: Path) -> list[str]:
    make_shards(tmp_path / "in", 3, 1)
    affinity = tmp_path / "affinity.yaml"
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    affinity.write_text(yaml.safe_dump({"affinity": {"nodeAffinity": required}}))
    return [str(write_job_file(tmp_path)), "--inputs", str(tmp_path / "in" / "in-{000000..000002}.tar"),
            "--outputs", "s3://bucket/out/{name}.tar", "--image", "img:1", "--no-prepare", "--affinity", str(affinity)]


def render(kind: str, *argv: str, **env: str) -> tuple[dict, str]:
    result = CliRunner().invoke(main, [kind, *argv], env=env or None)
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout), result.stderr


def test_k8s_flags_validate_strictly_and_land_in_the_pod(args):
    job, _ = render("k8s", *args, *FLAGS)
    kubernetes_validate.validate(job, K8S, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"}, {"key": "dedicated", "operator": "Exists"}]
    assert pod["priorityClassName"] == "batch-low" and pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod["serviceAccountName"] == "shardflow-runner"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["example.com/cost"] == "x1"
    assert re.fullmatch(r"[0-9a-f]{16}", labels["shardflow/fingerprint"])
    assert job["metadata"]["labels"] == labels
    assert job["spec"]["template"]["metadata"]["annotations"]["owner"] == "data team"
    assert job["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    (container,) = pod["containers"]
    assert {"name": "secret-file-0", "mountPath": "/var/run/secrets/gcs", "readOnly": True} in container["volumeMounts"]
    assert {"name": "secret-file-0", "secret": {"secretName": "gcs-key"}} in pod["volumes"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "4"


def test_argo_flags_parse_into_hera_models(args):
    workflow, _ = render("argo", *args, *FLAGS)
    model = validate_workflow(workflow)
    spec = workflow["spec"]
    assert spec["podPriorityClassName"] == "batch-low"  # a Workflow's name for the pods' priority class
    assert model.spec.tolerations[0].key == "nvidia.com/gpu" and model.spec.affinity.node_affinity is not None
    assert spec["podMetadata"]["labels"]["team"] == "ml" and "shardflow/fingerprint" in spec["podMetadata"]["labels"]
    assert spec["podMetadata"]["annotations"]["owner"] == "data team"
    assert {"name": "secret-file-0", "secret": {"secretName": "gcs-key"}} in spec["volumes"]


def test_reruns_get_new_names_and_the_same_fingerprint(args):
    first, _ = render("k8s", *args)
    second, _ = render("k8s", *args)
    other, _ = render("k8s", *args, "--set", "sleep=0.5")
    names = {j["metadata"]["name"] for j in (first, second, other)}
    assert len(names) == 3 and all(re.fullmatch(r"shardflow-identity-[a-z0-9]{5}", n) for n in names)
    fingerprints = [j["metadata"]["labels"]["shardflow/fingerprint"] for j in (first, second, other)]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]  # the same run; other PARAMS: another run


def test_threads_follow_the_cpu_request_unless_set(args):
    assert [cpu_threads(c) for c in ("1", "500m", "2.5", "16", "2000m", "junk")] == [1, 1, 2, 16, 2, 1]
    job, _ = render("k8s", *args, "--cpu", "250m", "--env", "OMP_NUM_THREADS=3")
    env = [(e["name"], e["value"]) for e in job["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert ("OMP_NUM_THREADS", "3") in env and ("MKL_NUM_THREADS", "1") in env
    assert [name for name, _ in env].count("OMP_NUM_THREADS") == 1


@pytest.mark.parametrize("flag, value, says", [
    ("--toleration", "bad key!:NoSchedule", "qualified name"),
    ("--toleration", "gpu:Sometimes", "effect must be one of"),
    ("--label", "team=not ok", "values are"),
    ("--label", "noequals", "KEY=VALUE"),
    ("--secret-file", "key:relative/path", "NAME:/absolute/path"),
])
def test_bad_flags_are_one_line_errors(args, flag, value, says):
    result = CliRunner().invoke(main, ["k8s", *args, flag, value])
    assert result.exit_code == 2 and says in result.output, result.output  # a start error, as for `shardflow run`
    assert "Traceback" not in result.output


def test_affinity_file_errors(tmp_path, args):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodeAfinity": {}}))
    result = CliRunner().invoke(main, ["k8s", *args, "--affinity", str(bad)])
    assert result.exit_code != 0 and "--affinity" in result.output and "nodeAffinity" in result.output
    with pytest.raises(JobError):
        parse_toleration("")


def test_local_run_dir_needs_a_pvc_covering_it(tmp_path, monkeypatch):
    make_shards(tmp_path / "in", 2, 1)
    base = [str(write_job_file(tmp_path)), "--inputs", str(tmp_path / "in" / "in-{000000..000001}.tar"),
            "--outputs", f"{tmp_path}/out/{{name}}.tar", "--image", "img:1"]
    refused = CliRunner().invoke(main, ["k8s", *base])
    assert refused.exit_code == 2 and "pods do not see" in refused.output and "--pvc" in refused.output
    assert not (tmp_path / "out").exists()  # nothing written on the laptop
    other = CliRunner().invoke(main, ["argo", *base, "--pvc", "data:/mnt/elsewhere"])
    assert other.exit_code != 0 and "mounted: /mnt/elsewhere" in other.output
    monkeypatch.chdir(tmp_path)
    relative = CliRunner().invoke(main, ["k8s", *base, "--run-dir", "runs/r1", "--pvc", f"data:{tmp_path}"])
    assert relative.exit_code != 0 and "relative path" in relative.output
    ok = CliRunner().invoke(main, ["k8s", *base, "--pvc", f"data:{tmp_path}"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "out" / "_shardflow" / "plan.json").exists()
