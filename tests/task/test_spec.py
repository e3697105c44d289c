"""JobSpec: every setting once, and what derives from its fields (describe, fingerprint settings,
job.json, job-file keys, ShardJob's signature); a ShardJob is a value."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.task.spec import JOB_FILE_KEYS, RUNTIME, SECRET, JobSpec, setting_default


def _flip(sample):
    return sample


def test_the_fingerprint_settings_keep_their_keys_so_old_plans_still_match():
    spec = JobSpec(inputs="a.tar", outputs="b.tar")
    # the keys plans have been fingerprinted with since 0.1.0: a new optional setting must not add one
    assert spec.settings() == {"decode": None, "encode": {}, "seed": 0, "maxcount": None, "maxsize": None,
                               "inputs_per_task": 1, "params": None}
    batched = spec.replace(batch_size=4, device="cpu")
    assert batched.settings()["batch_size"] == 4 and batched.settings()["collate"] is False
    assert batched.settings()["device"] == "cpu"
    assert "on_error" not in spec.settings() and "storage_options" not in spec.settings()


def test_describe_leaves_out_locations_credentials_and_runtime_switches():
    described = JobSpec(inputs="s3://b/a.tar", outputs="o.tar", storage_options={"key": "k"}, limit=3).describe()
    assert not {"inputs", "outputs", "run_dir", "storage_options", "limit", "debug"} & set(described)
    assert {"on_error", "io_retries", "name", "seed"} <= set(described)


def test_the_record_and_the_pickle_hold_no_credential():
    spec = JobSpec(inputs="s3://user:pw@b/a.tar", outputs="s3://b/o/{name}.tar",
                   storage_options={"key": "AKIA", "secret": "s3cr3t", "anon": False})
    recorded = spec.record_settings()
    assert "pw" not in str(recorded) and "s3cr3t" not in str(recorded) and "AKIA" not in str(recorded)
    assert recorded["storage_options"] == {"anon": False}
    assert {f.name for f in dataclasses.fields(JobSpec) if f.metadata["role"] == SECRET} == {"storage_options"}
    assert not {f.name for f in dataclasses.fields(JobSpec) if f.metadata["role"] == RUNTIME} & set(recorded)


def test_job_file_keys_are_the_settings_a_file_may_set():
    assert "batch_size" in JOB_FILE_KEYS and "device" in JOB_FILE_KEYS and "storage_options" in JOB_FILE_KEYS
    assert not {"debug", "limit", "fn_args", "fn_kwargs", "params"} & set(JOB_FILE_KEYS)


def test_a_job_is_a_value():
    job = sf.ShardJob(_flip, "a.tar", "b.tar", seed=3)
    with pytest.raises(AttributeError, match=r"job.replace\(on_error=...\)"):
        job.on_error = "raise"
    other = job.replace(on_error="raise", seed=4)
    assert (job.spec.on_error, job.spec.seed) == ("skip", 3)
    assert (other.spec.on_error, other.seed) == ("raise", 4)
    assert other.fn is job.fn and other.spec.name == job.spec.name == "_flip"
    restored = pickle.loads(pickle.dumps(other))
    assert restored.spec == other.spec


def test_unknown_settings_are_refused_with_the_valid_names():
    with pytest.raises(JobError, match=r"unknown job setting 'sed'; valid: inputs, outputs, decode"):
        sf.ShardJob(_flip, "a.tar", "b.tar", sed=1)
    with pytest.raises(JobError, match="unknown job setting"):
        sf.ShardJob(_flip, "a.tar", "b.tar").replace(maxcuont=3)


def test_the_signature_is_derived_from_the_fields():
    params = inspect.signature(sf.ShardJob).parameters
    for f in dataclasses.fields(JobSpec):
        assert f.name in params, f.name
        if f.name not in ("inputs", "outputs"):
            assert params[f.name].default == setting_default(f.name)


def test_settings_are_checked_when_the_value_is_made():
    with pytest.raises(JobError, match="collate=True needs batch_size"):
        JobSpec(collate=True)
    with pytest.raises(JobError, match="device must be one of"):
        JobSpec(device="gpu")
    with pytest.raises(JobError, match="inputs_per_task"):
        JobSpec(inputs_per_task=0)
    assert JobSpec(maxcount=0, maxsize=1e4).rollover == (1 << 62, 10000.0)  # 0: not set; under 1536: refused
