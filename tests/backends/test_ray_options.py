"""What the Ray backend asks of Ray, decided without a cluster: task options from the job's settings and
`--ray-arg`, which failures Ray retries, how many tasks fit, and the GPU refusal (the runs themselves
are in test_ray.py and test_exactly_once.py)."""

from __future__ import annotations

import pickle

import pytest

from shardflow.backends.ray.on_worker import TransientFailure
from shardflow.backends.ray.resources import check_resources, parse_ray_args, slots, task_options
from shardflow.errors import JobError
from shardflow.job.shard_job import ShardJob


def _job(**settings) -> ShardJob:
    return ShardJob(lambda s: s, "in-{000000..000001}.tar", "out/{task}.tar", **settings)


def test_ray_args_are_read_as_yaml_values():
    assert parse_ray_args(()) is None
    assert parse_ray_args(("num_cpus=2", "resources={ssd: 1}", "runtime_env={working_dir: .}", "memory=4e9")) == {
        "num_cpus": 2, "resources": {"ssd": 1}, "runtime_env": {"working_dir": "."}, "memory": 4e9}
    with pytest.raises(JobError, match="KEY=VALUE"):
        parse_ray_args(("num_cpus",))


def test_only_the_transient_kind_is_retried_and_resources_follow_the_job():
    options = task_options(_job(), gpus_per_worker=None, memory=None, max_retries=3, ray_args=None)
    assert options["retry_exceptions"] == [TransientFailure]  # not input errors, not user bugs
    assert options["num_cpus"] == 1 and options["num_gpus"] == 0 and options["max_retries"] == 3
    gpu = task_options(_job(device="cuda"), gpus_per_worker=None, memory=2e9, max_retries=1,
                       ray_args={"num_cpus": 4, "resources": {"ssd": 1}})
    assert gpu["num_gpus"] == 1 and gpu["memory"] == 2_000_000_000
    assert gpu["num_cpus"] == 4 and gpu["resources"] == {"ssd": 1}  # --ray-arg wins over the defaults
    assert task_options(_job(), gpus_per_worker=2, memory=None, max_retries=0, ray_args=None)["num_gpus"] == 2
    with pytest.raises(JobError, match="set by shardflow"):
        task_options(_job(), gpus_per_worker=None, memory=None, max_retries=3, ray_args={"retry_exceptions": True})


def test_a_transient_failure_carries_its_results_through_pickling():
    results = [({"task_id": 3, "status": "failed", "kind": "io"}, 0.5)]
    again = pickle.loads(pickle.dumps(TransientFailure(results)))
    assert isinstance(again, TransientFailure) and again.results == results


def test_slots_and_the_gpu_refusal():
    assert slots({"num_cpus": 1, "num_gpus": 0}, {"CPU": 6.0}) == 6
    assert slots({"num_cpus": 1, "num_gpus": 1}, {"CPU": 6.0, "GPU": 2.0}) == 2
    assert slots({"num_cpus": 4}, {"CPU": 2.0}) == 1
    check_resources({"num_gpus": 1}, {"CPU": 2.0, "GPU": 1.0}, autoscaling=False)
    with pytest.raises(JobError, match="num_gpus=1"):
        check_resources({"num_gpus": 1}, {"CPU": 2.0}, autoscaling=False)
    check_resources({"num_gpus": 1}, {"CPU": 2.0}, autoscaling=True)  # an autoscaler may add GPU nodes
