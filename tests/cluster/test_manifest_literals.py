"""The strings a user gave (run directory, storage options, env values) reach the pod as they are.

The bug this guards against: Kubernetes expands `$(VAR)` in a container's args and env values when VAR
is in its env, and every pod has HOME=/tmp, so a run directory under `/mnt/x/o$(HOME)/` became
`/mnt/x/o/tmp/` in the pod (a run dir with no plan: every pod exits 78, or worse, another folder
written). common.container now writes Kubernetes' escape `$$` for each `$` the kubelet would read
(before `$` or `(`; common.literal). Argo Workflows reads
`{{...}}` as its own variables and has no escape: a user string holding `{{` is refused for Argo.
The round trips apply the kubelet's rule (tests/support/k8s_expansion.py) to the generated manifest.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from hera.workflows.models import Workflow
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.cli import main
from shardflow.cluster.manifests import ClusterOptions, manifest
from shardflow.cluster.manifests.common import literal
from shardflow.errors import JobError
from tests.support.k8s import input_keys, make_shards, output_keys, run_indexed_job, write_job_file
from tests.support.k8s_expansion import container_args, container_env, expand

RUN_DIR = "/mnt/x/o$(HOME)/a$$b/$(NOPE)/c$(/_shardflow$"
STORAGE = "client_kwargs.endpoint_url=http://minio:9000/$(AWS_REGION)$$"
ENV = {"A_PATH": "/data/$(HOME)/x$", "B_REF": "$$(A_PATH)"}
STORAGE_REF = "token=${GCS_TOKEN}"  # the worker's own reference: no escape needed, none written
SECRETS = {"AWS_REGION": "eu-west-1"}  # a key of a --secret (envFrom): defined in the pod too


def _options(**kw) -> ClusterOptions:
    options = dict(image="registry.example/shardflow:0.1", run_dir=RUN_DIR, tasks=4, name="lit", env=ENV,
                   storage_options=(STORAGE, STORAGE_REF), secrets=("s3",), pvcs=(("data", "/mnt/x"),))
    return ClusterOptions(**{**options, **kw})


def _containers(kind: str, data: dict) -> list[dict]:
    if kind == "kubernetes":
        return data["spec"]["template"]["spec"]["containers"]
    return [t["container"] for t in data["spec"]["templates"] if "container" in t]


def test_the_expansion_rule_as_documented():
    """The examples of Kubernetes' docs page "Define Dependent Environment Variables"."""
    defined = {"SERVICE_PORT": "80", "SERVICE_IP": "172.17.0.1", "PROTOCOL": "https"}
    assert expand("$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)", defined) == "https://172.17.0.1:80"
    assert expand("$(UNDEFINED)://x", defined) == "$(UNDEFINED)://x"
    assert expand("$$(SERVICE_IP)", defined) == "$(SERVICE_IP)"
    assert expand("a$$b$c$(d$", {}) == "a$b$c$(d$"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="$()a{}", max_size=12),
       st.dictionaries(st.sampled_from(["a", "HOME", "", "$"]), st.text(alphabet="$(a)", max_size=4)))
def test_literal_round_trips_through_the_kubelet(text, defined):
    assert expand(literal(text), defined) == text


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
def test_the_pod_gets_the_literal_strings(kind):
    data = manifest(_options(), kind)
    if kind == "kubernetes":
        for version in ("1.31.0", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(data, version, strict=True)
    else:
        Workflow.model_validate(data)
    containers = _containers(kind, data)
    assert len(containers) == (1 if kind == "kubernetes" else 2)
    for spec in containers:
        assert "/mnt/x/o$$(HOME)/a$$$b/$$(NOPE)/c$$(/_shardflow$" in spec["args"]  # the escaped form
        assert f"{STORAGE_REF}" in spec["args"]  # a `$` the kubelet keeps is written as it is
        env = container_env(spec, SECRETS)
        assert {k: env[k] for k in ENV} == ENV and env["HOME"] == "/tmp"
        argv = container_args(spec, env)
        assert argv[argv.index("--run-dir") + 1] == RUN_DIR
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--storage-option"] == [STORAGE, STORAGE_REF]
    if kind == "argo":  # Argo's own variables are left for Argo
        assert containers[0]["args"][-2:] == ["--index", "{{inputs.parameters.index}}"]
        assert data["spec"]["templates"][0]["steps"][0][0]["arguments"]["parameters"][0]["value"] == "{{item}}"


@pytest.mark.parametrize("where", [dict(run_dir="s3://b/{{workflow.name}}/run"), dict(env={"A": "x{{y}}"}),
                                   dict(storage_options=("anon={{z",)), dict(extra_annotations={"note": "{{a}}"})],
                         ids=["run dir", "env", "storage option", "annotation"])
def test_argo_refuses_braces_it_cannot_escape(where):
    with pytest.raises(JobError, match="holds '[{][{]', which Argo Workflows reads as a template variable"):
        manifest(_options(**{"run_dir": "s3://b/run", **where}), "argo")
    data = manifest(_options(**{"run_dir": "s3://b/run", **where}), "kubernetes")  # no meaning to Kubernetes
    kubernetes_validate.validate(data, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.slow
def test_a_run_dir_named_like_a_variable_runs_in_pods(tmp_path):
    """End to end: `shardflow k8s` for outputs under a folder named `o$(HOME)`, run by the local pod
    runner, which expands $(VAR) as the kubelet does; before, the pods looked for the plan under
    `o<pod's HOME>` and exited 78."""
    make_shards(tmp_path / "in", 2, 3)
    out = tmp_path / "o$(HOME)$$"
    result = CliRunner().invoke(main, [
        "k8s", str(write_job_file(tmp_path)), "--inputs", str(tmp_path / "in" / "in-{000000..000001}.tar"),
        "--outputs", f"{out}/{{name}}.tar", "--image", "shardflow:test", "--pvc", f"data:{tmp_path}"])
    assert result.exit_code == 0, result.output
    run = run_indexed_job(yaml.safe_load(result.stdout), tmp_path / "pods")
    assert run.complete and output_keys(out) == input_keys(2, 3)
