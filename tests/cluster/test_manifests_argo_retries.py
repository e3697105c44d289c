"""Argo retry and continueOn fields, read through hera's Argo models and judged by Argo's own rules.

Argo's rules, as its controller applies them (workflow/controller/operator.go, processNodeRetries; docs
"Retries" and the Backoff/ContinueOn field docs):
- backoff.maxDuration is measured from the retry node's start, i.e. the FIRST attempt: once that much
  time has passed, no further retry is made ("Max duration limit exceeded"), however long the last
  attempt ran;
- a step whose node ends in phase Failed (a non-zero exit) stops its step group unless
  continueOn.failed; one that ends in phase Error (pod deleted, evicted, node lost) unless continueOn.error.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from shardflow.cli import main
from tests.cluster.test_manifests_argo import validate_workflow, workflow_for
from tests.support.k8s import argo_expression, make_shards, write_job_file

MINUTE = 60.0


def _seconds(duration: str | None) -> float | None:
    if duration is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]] if duration[-1] in units else float(duration)


def argo_retries(strategy, *, since_first_attempt: float, attempts: int, status: str, exit_code: str) -> bool:
    """Whether Argo starts another attempt of a node (the model of processNodeRetries above)."""
    limit = int(strategy.limit.__root__ if hasattr(strategy.limit, "__root__") else strategy.limit.root)
    backoff = strategy.backoff
    max_duration = _seconds(backoff.max_duration) if backoff is not None else None
    if max_duration is not None and since_first_attempt > max_duration:
        return False
    if attempts > limit:
        return False
    policy = strategy.retry_policy or "OnFailure"
    if policy != "Always" and policy != ("OnFailure" if status == "Failed" else "OnError"):
        return False
    return argo_expression(strategy.expression or "true", status, exit_code)


def group_continues(continue_on, phase: str) -> bool:
    """Whether a step group goes on past a child node that ended in `phase` (Failed or Error)."""
    if phase == "Succeeded":
        return True
    if continue_on is None:
        return False
    return bool(continue_on.failed if phase == "Failed" else continue_on.error)


def _templates(data: dict):
    model = validate_workflow(data)
    return model, {t.name: t for t in model.spec.templates}


def test_a_chunk_preempted_late_is_still_retried():
    _, templates = _templates(workflow_for(retries=3))
    strategy = templates["chunk"].retry_strategy
    assert strategy.backoff.max_duration is None
    # first attempt started 40 minutes ago and was evicted (Error, no exit code), or was killed (137)
    assert argo_retries(strategy, since_first_attempt=40 * MINUTE, attempts=1, status="Error", exit_code="")
    assert argo_retries(strategy, since_first_attempt=6 * 3600, attempts=2, status="Failed", exit_code="137")
    assert not argo_retries(strategy, since_first_attempt=60, attempts=4, status="Failed", exit_code="75")  # limit
    assert not argo_retries(strategy, since_first_attempt=60, attempts=1, status="Failed", exit_code="65")
    assert not argo_retries(strategy, since_first_attempt=60, attempts=1, status="Failed", exit_code="78")


def test_the_model_reproduces_the_old_defect():
    data = workflow_for()
    data["spec"]["templates"][1]["retryStrategy"]["backoff"]["maxDuration"] = "30m"  # what 0.1 generated
    _, templates = _templates(data)
    strategy = templates["chunk"].retry_strategy
    assert argo_retries(strategy, since_first_attempt=10 * MINUTE, attempts=1, status="Error", exit_code="")
    assert not argo_retries(strategy, since_first_attempt=40 * MINUTE, attempts=1, status="Error", exit_code="")


def test_max_duration_is_a_flag(tmp_path):
    _, templates = _templates(workflow_for(retry_max_duration="12h"))
    for name in ("chunk", "finalize"):
        assert templates[name].retry_strategy.backoff.max_duration == "12h"
    make_shards(tmp_path / "in", 2, 1)
    result = CliRunner().invoke(main, [
        "argo", str(write_job_file(tmp_path)), "--inputs", str(tmp_path / "in" / "in-{000000..000001}.tar"),
        "--outputs", "s3://b/out/{name}.tar", "--image", "i:1", "--no-prepare", "--retry-max-duration", "8h"])
    assert result.exit_code == 0, result.output
    assert "maxDuration: 8h" in result.stdout


@pytest.mark.parametrize("phase", ["Failed", "Error"])
def test_an_evicted_or_failed_item_does_not_stop_the_summary(phase):
    model, templates = _templates(workflow_for())
    main_steps = templates["main"].steps
    fan_out = main_steps[0].__root__[0] if hasattr(main_steps[0], "__root__") else main_steps[0].root[0]
    assert group_continues(fan_out.continue_on, phase)
    old = fan_out.continue_on.model_copy(update={"error": None})  # {failed: true} alone, as 0.1 generated
    assert group_continues(old, "Failed") and not group_continues(old, "Error")


def test_service_account_for_the_executor():
    model, _ = _templates(workflow_for(service_account="shardflow-argo"))
    assert model.spec.service_account_name == "shardflow-argo"
