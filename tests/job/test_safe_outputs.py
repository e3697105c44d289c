"""Issue 11, safe outputs: in-place outputs refused, foreign shards refused unless --overwrite, a code
change detected (--redo / --resume-anyway), one default run directory per job. Real subprocesses."""

from __future__ import annotations

import json
import shutil

import pytest

import shardflow as sf
from shardflow.errors import JobError
from shardflow.job.fingerprint import code_fingerprint
from shardflow.shards.samples import read_samples
from tests.support.jobs import cli, file_bytes, make_shards, spec, tars, write_job

JOB = """
    def process(sample):
        return {"__key__": sample["__key__"], "txt": "v1"}
"""


@pytest.fixture()
def data(tmp_path):
    make_shards(tmp_path / "in", 2, 3)
    return tmp_path, spec(tmp_path / "in", "in", 2)


def _texts(directory) -> set[bytes]:
    return {s["txt"] for p in tars(directory) for s in read_samples(str(p))}


@pytest.mark.slow
def test_outputs_that_are_the_inputs_are_refused(data):
    tmp_path, inputs = data
    job = write_job(tmp_path, JOB)
    before = file_bytes(tars(tmp_path / "in"))
    for outputs in (str(tmp_path / "in" / "{name}.tar"), inputs, str(tmp_path / "in" / ".." / "in" / "{name}.tar")):
        done = cli("run", job, "-i", inputs, "-o", outputs, "-b", "serial")
        assert done.returncode == 2, done.stdout
        assert "is the input shard" in done.stderr and "would destroy its inputs" in done.stderr
    assert file_bytes(tars(tmp_path / "in")) == before
    assert not (tmp_path / "in" / "_shardflow" / "done").exists()


def test_other_shards_beside_the_outputs_do_not_stop_a_run(data):
    """Issue 29 item 3: only what would really be overwritten is refused; another dataset's shards in the
    output folder are left alone and do not need --overwrite."""
    tmp_path, inputs = data
    job = write_job(tmp_path, JOB)
    make_shards(tmp_path / "out", 1, 2, name="someone-else")
    before = (tmp_path / "out" / "someone-else-000000.tar").read_bytes()
    args = ["run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial"]
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "someone-else-000000.tar").read_bytes() == before
    assert cli(*args).returncode == 0  # its own outputs (and rollover parts) are not foreign to a rerun


def test_a_shard_under_a_planned_name_from_elsewhere_is_not_overwritten_silently(data):
    tmp_path, inputs = data
    make_shards(tmp_path / "out", 1, 2, name="in")  # out/in-000000.tar: not written by any run of this job
    job = write_job(tmp_path, JOB)
    refused = cli("run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial")
    assert refused.returncode == 2 and "output in-000000.tar in" in refused.stderr
    assert "already exists and no run of this run directory" in refused.stderr and "--overwrite" in refused.stderr
    assert not (tmp_path / "out" / "_shardflow").exists()  # a refusal leaves nothing behind
    forced = cli("run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial", "--overwrite")
    assert forced.returncode == 0, forced.stderr


@pytest.mark.slow
def test_a_changed_process_is_detected_and_asks_for_redo_or_resume_anyway(data):
    tmp_path, inputs = data
    job = write_job(tmp_path, JOB)
    args = ["run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial"]
    assert cli(*args).returncode == 0
    job.write_text(job.read_text().replace('"v1"', '"v2"'))
    changed = cli(*args)
    assert changed.returncode == 2
    assert f"job file {job} changed" in changed.stderr
    assert "--redo" in changed.stderr and "--resume-anyway" in changed.stderr
    assert _texts(tmp_path / "out") == {b"v1"}
    planned = cli("plan", *args[1:-2])
    assert planned.returncode == 0 and "(2 of 2 tasks done) made by OTHER code" in planned.stdout

    kept = cli(*args, "--resume-anyway")
    assert kept.returncode == 0, kept.stderr
    assert "2/2 tasks done (2 already done before)" in kept.stdout and _texts(tmp_path / "out") == {b"v1"}
    assert cli(*args).returncode == 0  # the new code is recorded: no question the next time

    job.write_text(job.read_text().replace('"v2"', '"v3"'))
    redone = cli(*args, "--redo")
    assert redone.returncode == 0, redone.stderr
    assert "2/2 tasks done (0 already done before)" in redone.stdout and _texts(tmp_path / "out") == {b"v3"}
    plan = json.loads((tmp_path / "out" / "_shardflow" / "plan.json").read_text())
    assert plan["code"]["job_file"] == str(job) and len(plan["code"]["fingerprint"]) == 16


def test_redo_redoes_a_changed_function_with_an_unchanged_plan(data):
    tmp_path, inputs = data
    job = write_job(tmp_path, JOB)
    args = ["run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial"]
    assert cli(*args).returncode == 0
    job.write_text(job.read_text().replace('"v1"', '"v2"'))
    forced = cli(*args, "--redo")
    assert forced.returncode == 0 and "(0 already done before)" in forced.stdout
    assert _texts(tmp_path / "out") == {b"v2"}


def _upper(sample):
    return {"__key__": sample["__key__"], "txt": "A"}


def _lower(sample):
    return {"__key__": sample["__key__"], "txt": "a"}


def test_library_jobs_fingerprint_the_function_source(data):
    tmp_path, inputs = data
    out = str(tmp_path / "out" / "{name}.tar")
    first = sf.ShardJob(_upper, inputs, out, name="case")
    first.run("serial", progress=False)
    again = sf.ShardJob(_upper, inputs, out, name="case")
    assert again.run("serial", progress=False).skipped == 2
    other = sf.ShardJob(_lower, inputs, out, name="case")
    with pytest.raises(JobError, match="the job's code differs .*function .*_upper -> .*_lower"):
        other.run("serial", progress=False)
    assert code_fingerprint(first)["fn_digest_from"] == "source"
    assert code_fingerprint(first)["fingerprint"] != code_fingerprint(other)["fingerprint"]


@pytest.mark.slow
def test_two_jobs_writing_into_one_folder_keep_their_own_run_directories(data):
    tmp_path, inputs = data
    first = write_job(tmp_path, JOB, "first.py")
    second = write_job(tmp_path, JOB.replace('"v1"', '"second"'), "second.py")
    out = tmp_path / "out"
    assert cli("run", first, "-i", inputs, "-o", out / "{name}.tar", "-b", "serial").returncode == 0
    done = cli("run", second, "-i", inputs, "-o", out / "second-{name}.tar", "-b", "serial", "--overwrite")
    assert done.returncode == 0, done.stderr
    own = [p.name for p in out.iterdir() if p.name.startswith("_shardflow-second-")]
    assert len(own) == 1 and f"run {out / own[0]}:" in done.stdout
    assert json.loads((out / "_shardflow" / "plan.json").read_text())["job"]["name"] == "first"
    status = cli("status", out / "_shardflow")
    assert "(job first): complete" in status.stdout and "2 done" in status.stdout
    rerun = cli("run", second, "-i", inputs, "-o", out / "second-{name}.tar", "-b", "serial")
    assert rerun.returncode == 0 and "(2 already done before)" in rerun.stdout


def test_rollover_parts_of_an_earlier_run_are_its_own(data):
    tmp_path, inputs = data
    job = write_job(tmp_path, JOB)
    args = ["run", job, "-i", inputs, "-o", tmp_path / "out" / "{name}.tar", "-b", "serial", "--set", "maxcount=1"]
    assert cli(*args).returncode == 0
    assert "in-000000_002.tar" in [p.name for p in tars(tmp_path / "out")]
    # task 1 redone over its own parts: its marker gone, and the per-chunk summaries that also record it
    (tmp_path / "out" / "_shardflow" / "done" / "000001.json").unlink()
    shutil.rmtree(tmp_path / "out" / "_shardflow" / "summaries", ignore_errors=True)
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "2/2 tasks done (1 already done before)" in again.stdout


def test_guards_on_an_object_store(data, s3_server, s3_bucket):
    tmp_path, inputs = data
    options = s3_server.storage_options
    from shardflow.shards.writer import TarWriter

    for name in ("foreign-000000.tar", "in-000001.tar"):  # the second one under a planned name
        with TarWriter(f"{s3_bucket}/out/{name}", storage_options=options) as writer:
            writer.write({"__key__": "x", "txt": b"not ours"})
    out = f"{s3_bucket}/out/{{name}}.tar"
    job = sf.ShardJob(_upper, inputs, out, name="case", storage_options=options)
    with pytest.raises(JobError, match="output in-000001.tar in .* already exists and no run"):
        job.run("serial", progress=False)
    assert job.run("serial", progress=False, overwrite=True).ok
    assert sf.ShardJob(_upper, inputs, out, name="case", storage_options=options).run("serial", progress=False).ok
    in_place = sf.ShardJob(_upper, f"{s3_bucket}/out/foreign-000000.tar", f"{s3_bucket}/out/foreign-000000.tar",
                           storage_options=options)
    with pytest.raises(JobError, match="would destroy its inputs"):
        in_place.run("serial", progress=False)


def test_an_input_named_dot_dot_cannot_put_an_output_above_the_output_folder(tmp_path):
    """Issue 26 item 6: input names come from whoever fills the bucket; `...tar` has the stem `..`."""
    make_shards(tmp_path / "in", 1, 2)
    (tmp_path / "in" / "in-000000.tar").rename(tmp_path / "in" / "...tar")
    job = write_job(tmp_path, JOB)
    (tmp_path / "out").mkdir()
    refused = cli("run", job, "-i", tmp_path / "in" / "...tar", "-o", tmp_path / "out" / "{name}" / "x.tar",
                  "-b", "serial")
    assert refused.returncode == 2, refused.stdout
    assert "has the name '..'" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "x.tar").exists() and not list((tmp_path / "out").iterdir())


def test_an_output_name_that_leaves_the_pattern_folder_is_refused():
    from shardflow.job.naming import pattern_name

    assert pattern_name("out/{name}.tar", 0, "in/a.tar") == ("out/a.tar", "out/a_{part:03d}.tar")
    with pytest.raises(JobError, match="resolves outside 'out'"):
        pattern_name("out/x{name}/../../y.tar", 0, "in/a.tar")  # out/xa/../../y.tar is y.tar
    with pytest.raises(JobError, match="has the name '.'"):
        pattern_name("s3://b/out/{name}/x.tar", 0, "s3://evil/..tar")


def test_a_symlinked_input_file_is_found_in_place_even_with_overwrite(tmp_path):
    """Issue 26 item 12: `in/a.tar -> data/a.tar` with outputs `data/{name}.tar` would replace the file the
    input is; compared by where the link points, whatever --overwrite says."""
    make_shards(tmp_path / "data", 1, 3, name="a")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a-000000.tar").symlink_to(tmp_path / "data" / "a-000000.tar")
    before = (tmp_path / "data" / "a-000000.tar").read_bytes()
    job = write_job(tmp_path, JOB)
    for extra in ([], ["--overwrite"]):
        refused = cli("run", job, "-i", tmp_path / "in" / "a-000000.tar", "-o", tmp_path / "data" / "{name}.tar",
                      "-b", "serial", *extra)
        assert refused.returncode == 2, refused.stdout
        assert "is the input shard" in refused.stderr and "would destroy its inputs" in refused.stderr
    assert (tmp_path / "data" / "a-000000.tar").read_bytes() == before
