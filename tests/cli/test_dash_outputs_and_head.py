"""`-o -` is standard output in every command that takes -o (tsv, show, report; index refuses it in one
line), `head` stops at its N-th sample and writes record streams, the shell tools' messages say what
happened (duplicates, exit 2 for a run directory that holds no run), and a job reading stdin reads it on
every run from the command line too."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from click.testing import CliRunner
from PIL import Image

from shardflow.cli import main
from shardflow.shards.samples import read_samples


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def make_tar(path, members: dict[str, bytes | str]):
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("shardflow: error: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file named `-` would land here
    return tmp_path


# ------------------------------------------------------------------------------------------------
# -o - is standard output


def test_tsv_to_dash_writes_stdout_not_a_file_named_dash(here):
    shard = make_tar(here / "a.tar", {"s0.txt": "A"})
    result = run("tsv", shard, "-f", "txt", "-o", "-")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1] == f"s0\t{shard}\tA"
    assert not (here / "-").exists()


def test_show_to_dash_writes_the_png_alone(here):
    png = io.BytesIO()
    Image.new("RGB", (20, 10), "red").save(png, format="PNG")
    shard = make_tar(here / "img.tar", {"k0.png": png.getvalue(), "k0.cls": "1"})
    result = run("show", shard, "-o", "-")
    assert result.exit_code == 0, result.stderr
    assert Image.open(io.BytesIO(result.stdout_bytes)).format == "PNG"
    assert "tiles written to standard output" in result.stderr and not (here / "-").exists()


@pytest.mark.slow  # the page's first build imports its plotting (~1.5 s)
def test_report_to_dash_writes_the_page_to_stdout(here):
    shard = make_tar(here / "a.tar", {"s0.txt": "A"})
    assert run("cat", shard, "-o", here / "all.tar", "-b", "serial").exit_code == 0
    page = run("report", here / "_shardflow", "-o", "-", "-n", "0")
    assert page.exit_code == 0, page.stderr
    assert page.stdout.startswith("<!DOCTYPE html>") and not (here / "-").exists()
    numbers = run("report", here / "_shardflow", "-o", "-", "--json")
    assert json.loads(numbers.stdout)["summary"]["done"] == 1


def test_report_on_a_directory_without_a_run_exits_2_as_status(here):
    (here / "empty").mkdir()
    for run_dir in (here / "empty", here / "missing"):
        result = run("report", run_dir)
        assert result.exit_code == 2  # was 1; `status` says 2 for the same cause
        assert "no plan.json" in one_line(result.stderr)


def test_index_refuses_dash_in_one_line(here):
    shard = make_tar(here / "a.tar", {"s0.txt": "A"})
    result = run("index", shard, "-o", "-")
    assert result.exit_code == 2
    assert "-o - (standard output)" in one_line(result.stderr)
    assert not (here / "-").exists()


# ------------------------------------------------------------------------------------------------
# head


def test_head_stops_at_its_nth_sample_before_a_bad_one(here):
    shard = make_tar(here / "bad.tar", {"s0.txt": "0", "s1.txt": "1", "s2.txt": "2", "s3.txt": "3" * 10_000})
    shard.write_bytes(shard.read_bytes()[:3 * 1024 + 512 + 2000])  # s3.txt's data cut short: a bad 4th sample
    result = run("head", shard, "-n", "3", "-o", here / "h.tar")
    assert result.exit_code == 0, result.stderr  # was 1: it asked for the 4th sample before stopping
    assert [s["__key__"] for s in read_samples(str(here / "h.tar"))] == ["s0", "s1", "s2"]


@pytest.mark.parametrize("name", ["h.cbors", "h.mps"])
def test_head_writes_a_record_stream_named_so(here, name):
    shard = make_tar(here / "a.tar", {"s0.txt": "A", "s1.txt": "B"})
    result = run("head", shard, "-n", "1", "-o", here / name)
    assert result.exit_code == 0, result.stderr
    assert [(s["__key__"], s["txt"]) for s in read_samples(str(here / name))] == [("s0", b"A")]


def test_head_says_duplicates_were_left_out(here):
    shard = make_tar(here / "a.tar", {"s0.txt": "A"})
    result = run("head", shard, shard, "-n", "2", "-o", here / "x.tar")
    assert result.exit_code == 0
    summary = result.stderr.splitlines()[-1]
    assert "1 samples written" in summary and "left out (duplicate or unwritable keys" in summary
    assert "SPEC holds only 2" not in summary


# ------------------------------------------------------------------------------------------------
# jobs


def test_a_job_on_stdin_reruns_and_refuses_extend_in_one_line(here):
    first = make_tar(here / "a.tar", {"s0.txt": "A"}).read_bytes()
    second = make_tar(here / "b.tar", {"s0.txt": "B", "s1.txt": "B1"}).read_bytes()
    assert run("cat", "-", "-o", here / "out.tar", "-b", "serial", input=first).exit_code == 0
    result = run("cat", "-", "-o", here / "out.tar", "-b", "serial", input=second)
    assert result.exit_code == 0 and "0 already done before" in result.stdout
    assert [s["txt"] for s in read_samples(str(here / "out.tar"))] == [b"B", b"B1"]
    refused = run("cat", "-", "-o", here / "out.tar", "-b", "serial", "--extend", input=second)
    assert refused.exit_code == 2
    line = one_line(refused.stderr)
    assert "--extend" in line and "standard input" in line and "--redo" not in line


def test_sort_help_says_an_empty_input_gives_no_output_shard():
    text = " ".join(run("sort", "--help").stdout.split())
    assert "Each input shard becomes one output shard" not in text
    assert "no empty shard is ever written" in text
