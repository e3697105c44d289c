"""Job files: the convention, --set overrides, error messages, and shipping the module to workers."""

from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

from shardflow.errors import JobError
from shardflow.job.jobfile import (
    builtin_jobs,
    job_options,
    load_job,
    load_job_file,
    parse_overrides,
    resolve_job_path,
)
from tests.support.jobs import cli_env, keys_in, make_shards, spec, tars, write_job

JOB = """
    '''a test job: copies samples and tags them.'''
    import shardflow as sf

    JOB = dict(maxcount=7, on_error="skip")
    SEED = 3
    PARAMS = {"tag": "x", "times": 1, "scale": 0.5, "flag": False, "labels": [1, 2], "nested": {"a": 1, "b": 2}}

    def helper(value):
        return f"{PARAMS['tag']}-{value}"

    def process(sample):
        out = {"__key__": sample["__key__"], "jpg": sample["jpg"], "txt": helper(PARAMS["times"])}
        return out
"""


def test_conventions_and_defaults(tmp_path):
    path = write_job(tmp_path, JOB)
    job = load_job(path, inputs="a.tar", outputs="b.tar")
    assert job.maxcount == 7 and job.seed == 3 and job.on_error == "skip"
    assert job.name == "job"
    assert job.params == {"tag": "x", "times": 1, "scale": 0.5, "flag": False, "labels": [1, 2],
                          "nested": {"a": 1, "b": 2}}
    loaded = load_job_file(path)
    assert loaded.summary() == "a test job: copies samples and tags them."
    assert loaded.defaults == {"maxcount": 7, "on_error": "skip", "seed": 3}
    assert "params" not in job_options() and "fn" not in job_options() and "maxcount" in job_options()


def test_overrides_types_dotted_and_prefixes(tmp_path):
    path = write_job(tmp_path, JOB)
    job = load_job(path, inputs="a.tar", outputs="b.tar", overrides=parse_overrides([
        "maxcount=100", "tag=42", "times=3", "scale=2", "flag=true", "labels=[3]", "nested.b=5",
        "encode.png_compress_level=6", "job.seed=9", "params.nested.c=1",
    ]))
    assert job.maxcount == 100 and job.seed == 9
    assert job.encode == {"png_compress_level": 6}
    assert load_job(path, inputs="a", outputs="b", overrides=parse_overrides(["maxcount=1e4"])).maxcount == 10000
    # a str PARAMS default keeps the command-line text verbatim ("42", not 42); float defaults take ints
    assert job.params == {"tag": "42", "times": 3, "scale": 2.0, "flag": True, "labels": [3],
                          "nested": {"a": 1, "b": 5, "c": 1}}
    assert job.fn({"__key__": "k", "jpg": b"x"})["txt"] == "42-3"
    # explicit keyword arguments win over the file and over overrides
    job = load_job(path, inputs="a.tar", outputs="b.tar", overrides={"maxcount": 5}, maxcount=11, run_dir=None)
    assert job.maxcount == 11


@pytest.mark.parametrize("item, words", [
    ("nope=1", ["unknown setting 'nope'", "maxcount", "decode", "PARAMS of job.py: tag, times"]),
    ("times=many", ["'times' takes a number", "many"]),
    ("times=1.5", ["'times' takes an integer, got 1.5"]),
    ("flag=1", ["'flag' takes true or false"]),
    ("labels=3", ["'labels' takes a list"]),
    ("tag.x=1", ["'tag' is not a dict"]),
])
def test_bad_overrides_say_what_is_valid(tmp_path, item, words):
    path = write_job(tmp_path, JOB)
    with pytest.raises(JobError) as info:
        load_job(path, inputs="a.tar", outputs="b.tar", overrides=parse_overrides([item]))
    for word in words:
        assert word in str(info.value)


def test_parse_overrides_json_or_text():
    parsed = {k: v.value for k, v in parse_overrides(["a=1", "b=[1, 2]", "c=hello", "d=null", "e=a=b"]).items()}
    assert parsed == {"a": 1, "b": [1, 2], "c": "hello", "d": None, "e": "a=b"}
    with pytest.raises(JobError, match="not KEY=VALUE"):
        parse_overrides(["novalue"])


def test_fresh_module_per_load(tmp_path):
    path = write_job(tmp_path, JOB)
    first = load_job(path, inputs="a.tar", outputs="b.tar", overrides={"tag": "one"})
    second = load_job(path, inputs="a.tar", outputs="b.tar", overrides={"tag": "two"})
    assert first.fn({"__key__": "k", "jpg": b""})["txt"] == "one-1"
    assert second.fn({"__key__": "k", "jpg": b""})["txt"] == "two-1"


def test_syntax_error_names_file_and_line(tmp_path):
    path = write_job(tmp_path, "PARAMS = {}\n\ndef process(sample)\n    return sample\n", "broken.py")
    with pytest.raises(JobError) as info:
        load_job_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert f"job file {path}, line 3: SyntaxError" in message


def test_error_while_the_file_runs_names_file_and_line(tmp_path):
    path = write_job(tmp_path, "import os\nx = 1\nimport no_such_module_here\n", "imports.py")
    expected = r"imports.py, line 3: ModuleNotFoundError: No module named 'no_such_module_here'"
    with pytest.raises(JobError, match=expected):
        load_job_file(path)


def test_malformed_job_files(tmp_path):
    with pytest.raises(JobError, match=r"defines no function `process\(sample\)` \(it defines: transform\)"):
        load_job_file(write_job(tmp_path, "def transform(s):\n    return s\n", "a.py"))
    with pytest.raises(JobError, match="sets 'maxcount' twice"):
        load_job_file(write_job(tmp_path, "JOB = dict(maxcount=3)\nMAXCOUNT = 4\ndef process(s): return s\n", "b.py"))
    with pytest.raises(JobError, match="JOB has unknown ShardJob arguments 'maxcont'"):
        load_job_file(write_job(tmp_path, "JOB = dict(maxcont=3)\ndef process(s): return s\n", "c.py"))
    with pytest.raises(JobError, match="PARAMS keys 'seed' are also ShardJob arguments"):
        load_job_file(write_job(tmp_path, "PARAMS = dict(seed=1)\ndef process(s): return s\n", "d.py"))
    with pytest.raises(JobError, match="no outputs given"):
        load_job(write_job(tmp_path, "def process(s): return s\n", "e.py"), inputs="a.tar")
    with pytest.raises(JobError, match="on_error must be one of"):
        load_job(write_job(tmp_path, "def process(s): return s\n", "f.py"), inputs="a", outputs="b",
                 overrides={"on_error": "ignore"})


def test_builtin_names_resolve(tmp_path):
    names = builtin_jobs()
    assert {"augment", "resize", "filter", "reshard"} <= set(names)
    assert resolve_job_path("augment") == names["augment"]
    assert resolve_job_path("augment.py") == names["augment"]
    with pytest.raises(JobError, match=r"'nosuchjob' does not exist and is not a built-in job \(built-in: .*augment"):
        resolve_job_path("nosuchjob")
    with pytest.raises(JobError, match="does not exist"):
        resolve_job_path(str(tmp_path / "missing.py"))


def test_module_travels_by_value_to_a_process_that_cannot_import_it(tmp_path):
    """The pickled job works in a fresh interpreter where the job file's directory is not on sys.path."""
    path = write_job(tmp_path / "somewhere", JOB)
    job = load_job(path, inputs="a.tar", outputs="b.tar", overrides={"tag": "sent"})
    blob = cloudpickle.dumps(job)
    code = ("import sys, cloudpickle; job = cloudpickle.loads(sys.stdin.buffer.read()); "
            "print(job.fn({'__key__': 'k', 'jpg': b''})['txt'], job.maxcount)")
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=tmp_path, env=cli_env(),
                          timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["sent-1", "7"]


def test_job_file_runs_on_worker_processes(tmp_path):
    """Workers start from a fork server or by spawn: neither imported the job file; it arrives pickled."""
    make_shards(tmp_path / "in", 2, 5)
    path = write_job(tmp_path / "jobs", JOB)
    job = load_job(path, inputs=spec(tmp_path / "in", "in", 2), outputs=str(tmp_path / "out" / "{name}.tar"),
                   overrides={"tag": "proc"})
    report = job.run("processes", workers=2)
    assert report.ok, str(report)
    outputs = tars(tmp_path / "out")
    assert sum(keys_in(outputs).values()) == 10
    from shardflow.shards.samples import read_samples

    assert {s["txt"] for p in outputs for s in read_samples(str(p))} == {b"proc-1"}
