"""`shardflow k8s` / `job.to_kubernetes`: the Indexed Job validates, and says what we mean."""

from __future__ import annotations

import math
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from shardflow.cli import main
from shardflow.cluster.manifests import ClusterOptions, manifest, render_options
from shardflow.errors import JobError
from shardflow.job.jobfile import load_job
from tests.support.k8s import make_shards, write_job_file

# the oldest Kubernetes with everything the Job uses on by default (backoffLimitPerIndex and
# podReplacementPolicy beta since 1.29), and the newest schema kubernetes-validate ships
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())

VARIANTS = {
    "minimal": dict(),
    "everything": dict(namespace="data", parallelism=500, tasks_per_pod=3, cpu="500m", memory="3Gi",
                       secrets=("s3", "gcs"), env={"AWS_REGION": "eu-west-1"}, storage_options=("anon=false",),
                       service_account="sa", image_pull_secrets=("reg",), node_selector={"pool": "cpu"},
                       pvcs=(("scratch", "/data"),), retries=0, max_failed_indexes=7, ttl=0, deadline=3600,
                       tmp_size="4Gi", labels={"team": "ml"}),
    "huge": dict(tasks=250_000),
}


def job_for(**kw) -> dict:
    options = dict(image="registry.example/shardflow:0.1", run_dir="s3://b/run", tasks=100, name="augment")
    options.update(kw)
    return manifest(ClusterOptions(**options), "kubernetes")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_job_validates_strictly(variant, version):
    kubernetes_validate.validate(job_for(**VARIANTS[variant]), version, strict=True)


def test_validation_is_able_to_fail():
    job = job_for()
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)


def test_indexed_job_fields():
    job = job_for(tasks=100, tasks_per_pod=8, parallelism=64, retries=2)
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == math.ceil(100 / 8) == 13
    assert spec["parallelism"] == 13  # never more pods than indexes
    assert spec["backoffLimitPerIndex"] == 2
    assert 1 <= spec["maxFailedIndexes"] <= spec["completions"]
    assert spec["podReplacementPolicy"] in ("Failed", "TerminatingOrFailed")
    assert spec["ttlSecondsAfterFinished"] == 86400
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # required by podFailurePolicy
    (container,) = pod["containers"]
    assert container["command"] == ["shardflow"]
    assert container["args"] == ["worker", "--run-dir", "s3://b/run", "--tasks-per-index", "8"]
    assert container["imagePullPolicy"] in ("Always", "IfNotPresent", "Never")
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    labels = job["metadata"]["labels"]
    assert spec["template"]["metadata"]["labels"] == labels
    assert labels["app.kubernetes.io/instance"] == "augment"


def test_pod_failure_policy_maps_exit_codes():
    spec = job_for()["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    container = spec["template"]["spec"]["containers"][0]["name"]
    for rule in rules:
        assert rule["action"] in ("FailJob", "FailIndex", "Ignore", "Count")
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)
        if "onExitCodes" in rule:
            codes = rule["onExitCodes"]
            assert codes["operator"] in ("In", "NotIn")
            assert codes["containerName"] == container
            assert codes["values"] == sorted(set(codes["values"])) and 0 not in codes["values"]
        for condition in rule.get("onPodConditions", []):
            assert condition["status"] in ("True", "False", "Unknown")
    # evaluated in order: a disruption is ignored whatever the exit code, first
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    on_exit = [rule for rule in rules if "onExitCodes" in rule]
    actions = {code: rule["action"] for rule in on_exit for code in rule["onExitCodes"]["values"]}
    assert actions == {65: "FailIndex", 78: "FailJob"}  # 75 and crashes: counted, retried per index


def test_pod_is_locked_down():
    pod = job_for(secrets=("creds",))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
    assert "privileged" not in sc
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
    assert container["envFrom"] == [{"secretRef": {"name": "creds"}}]


def test_chunking_limits():
    assert job_for(tasks=250_000)["spec"]["completions"] == 10_000  # auto: 25 tasks per pod
    assert job_for(tasks=7)["spec"]["completions"] == 7
    with pytest.raises(JobError, match="more than 100000 indexes"):
        job_for(tasks=200_000, tasks_per_pod=1)
    with pytest.raises(JobError, match="no tasks"):
        job_for(tasks=0)
    with pytest.raises(JobError, match="--secret"):
        job_for(env={"AWS_SECRET_ACCESS_KEY": "x"})
    assert job_for(name="My_Job.v2 (test)")["metadata"]["name"] == "my-job-v2-test"


def test_manifest_is_small_for_any_number_of_shards():
    text = render_options(ClusterOptions("img:1", "s3://b/run", 100_000), "kubernetes")
    assert len(text.encode()) < 8_000


# -- through the CLI and the Python API ---------------------------------------------------------------
@pytest.fixture
def jobfile(tmp_path: Path) -> tuple[Path, list[str]]:
    make_shards(tmp_path / "in", 5, 2)
    args = ["--inputs", str(tmp_path / "in" / "in-{000000..000004}.tar"), "--outputs", f"{tmp_path}/out/{{name}}.tar",
            "--pvc", f"data:{tmp_path}"]  # a local run directory only where a volume puts it in the pods too
    return write_job_file(tmp_path), args


def test_retries_per_index_default_to_one_more_than_the_jobs_io_retries(jobfile):
    """A task that kills its pod is recorded failed by the attempt after its io_retries + 1 deaths
    (cluster.dead_attempts): an index that gave up at 3 retries (backoffLimitPerIndex) left nothing in
    failed/ saying which task or shard."""
    path, args = jobfile
    for extra, retries in (([], 4), (["--set", "io_retries=6"], 7), (["--retries", "2"], 2)):
        result = CliRunner().invoke(main, ["k8s", str(path), *args, *extra, "--image", "i", "--no-prepare"])
        assert result.exit_code == 0, result.output
        assert yaml.safe_load(result.stdout)["spec"]["backoffLimitPerIndex"] == retries
    slurm = CliRunner().invoke(main, ["slurm", str(path), *args[:4], "--shared-fs", "--no-prepare",
                                      "--set", "io_retries=6"])
    assert slurm.exit_code == 0 and "\nRETRIES=7\n" in slurm.stdout, slurm.output


def test_cli_writes_the_plan_and_prints_a_valid_job(jobfile, tmp_path):
    path, args = jobfile
    result = CliRunner().invoke(main, ["k8s", str(path), *args, "--image", "img:1", "--tasks-per-pod", "2"])
    assert result.exit_code == 0, result.output
    job = yaml.safe_load(result.stdout)
    kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)
    assert job["spec"]["completions"] == 3
    assert re.fullmatch(r"shardflow-identity-[a-z0-9]{5}", job["metadata"]["name"])  # unique on every render
    assert (tmp_path / "out" / "_shardflow" / "plan.json").exists()
    assert (tmp_path / "out" / "_shardflow" / "job.pkl").exists()
    assert "in-000000" not in result.stdout  # shard URLs stay in the run directory, never in the manifest
    assert "5 tasks, 3 pods" in result.stderr


def test_no_prepare_writes_nothing(tmp_path):
    path = write_job_file(tmp_path)
    result = CliRunner().invoke(main, [
        "k8s", str(path), "--inputs", "s3://nowhere/in-{000000..000099}.tar", "--outputs", "s3://nowhere/out/{name}.tar",
        "--image", "img:1", "--no-prepare"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["spec"]["completions"] == 100
    assert "nothing written" in result.stderr


def test_secrets_never_inline(jobfile):
    path, args = jobfile
    result = CliRunner().invoke(main, [
        "k8s", str(path), *args, "--image", "img:1", "--secret", "s3-creds", "--no-prepare",
        "-S", "key=AKIAEXAMPLEKEY", "-S", "secret=hunter2hunter2", "-S", "client_kwargs.endpoint_url=http://minio:9000",
        "-S", "token=${GCS_TOKEN}", "-S", "anon=false"], env={"GCS_TOKEN": "ya29.tokentokentoken"})
    assert result.exit_code == 0, result.output
    assert "ya29" not in result.stdout  # the reference is written, never its value
    assert "AKIAEXAMPLEKEY" not in result.stdout and "hunter2hunter2" not in result.stdout
    container = yaml.safe_load(result.stdout)["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    options = [container["args"][i + 1] for i, a in enumerate(container["args"]) if a == "--storage-option"]
    assert options == ["client_kwargs.endpoint_url=http://minio:9000", "token=${GCS_TOKEN}", "anon=false"]
    assert "key, secret" in result.stderr and "left out of the manifest" in result.stderr
    refused = CliRunner().invoke(main, ["k8s", str(path), *args, "--image", "i", "--env", "AWS_SECRET_ACCESS_KEY=x"])
    assert refused.exit_code == 2 and "--secret" in refused.output


def test_python_api_gives_the_same_yaml(jobfile, tmp_path):
    path, args = jobfile
    cli = CliRunner().invoke(main, ["k8s", str(path), *args, "--image", "img:1", "--parallelism", "4",
                                    "--tasks-per-pod", "2", "--secret", "creds", "--cpu", "2"])
    assert cli.exit_code == 0, cli.output
    job = load_job(path, inputs=args[1], outputs=args[3])
    unique = yaml.safe_load(cli.stdout)["metadata"]["name"].rpartition("-")[2]
    text = job.to_kubernetes(image="img:1", parallelism=4, tasks_per_pod=2, secrets=["creds"], cpu="2",
                             pvcs=[("data", str(tmp_path))], unique=unique)
    assert text == cli.stdout


def test_unset_variable_is_a_one_line_error(jobfile, monkeypatch):
    path, args = jobfile
    monkeypatch.delenv("SF_UNSET_VARIABLE", raising=False)
    result = CliRunner().invoke(main, ["k8s", str(path), *args, "--image", "i", "-S", "token=${SF_UNSET_VARIABLE}"])
    assert result.exit_code == 2 and "SF_UNSET_VARIABLE" in result.output
    assert "Traceback" not in result.output
