"""The report page of a real run, opened in headless Chromium (tests/support/chromium.py).

The run: 4 input shards over 2 worker processes; the job filters some samples (returns None), skips
some with a reason, fails on some (a ValueError whose message holds the key); shard 3 is not a tar
(its task fails, kind input); shard 2 is broken in the first run and repaired before the second, so
its task is retried and done. Shard 0 starts with hostile keys (`<script>`, a terminal escape).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from shardflow.job.shard_job import ShardJob
from shardflow.rundir.report import RunFailed
from shardflow.shards.writer import TarWriter
from shardflow.tools import report_page
from tests.support.jobs import REPO, cli, make_shards, tiny_jpeg

pytest.importorskip("matplotlib", reason="the report page's plots need matplotlib (the `report` extra)")

HOSTILE = "<script>alert(1)</script>\x1b[31mred"
FAILING = "<b>bold</b>\x1b]0;title\x07"
DOCS_SCREENSHOT = REPO / "docs" / "report-page.png"


def judge(sample: dict) -> dict | None:
    """Filter keys ending in 5, skip those ending in 3, fail on those ending in 7 and on FAILING."""
    from shardflow.errors import SkipSample

    key = sample["__key__"]
    if key == FAILING or key.endswith("7"):
        raise ValueError(f"cannot use sample {key}")
    if key.endswith("3"):
        raise SkipSample("too dark")
    if key.endswith("5"):
        return None
    return sample


def _write_hostile_shard(path: Path) -> None:
    with TarWriter(str(path)) as writer:
        for index, key in enumerate([HOSTILE, FAILING]):
            writer.write({"__key__": key, "jpg": tiny_jpeg(900 + index, (48, 32)),
                          "json": json.dumps({"label": f"<i>{index}</i>"}).encode()})
        for index in range(10):
            writer.write({"__key__": f"s{index:06d}", "jpg": tiny_jpeg(index, (48, 32)),
                          "json": json.dumps({"label": index % 3}).encode()})


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A run directory after two runs, its RunReport, and the page written for it."""
    tmp = tmp_path_factory.mktemp("report-run")
    make_shards(tmp / "in", 4, 30, size=(48, 32))
    _write_hostile_shard(tmp / "in" / "in-000000.tar")
    good_shard_2 = (tmp / "in" / "in-000002.tar").read_bytes()
    (tmp / "in" / "in-000002.tar").write_bytes(b"not a tar " * 100)
    (tmp / "in" / "in-000003.tar").write_bytes(b"not a tar either " * 100)
    job = ShardJob(judge, str(tmp / "in" / "in-{000000..000003}.tar"), str(tmp / "out" / "{name}.tar"),
                   on_error="skip", max_failure_rate=0.5)
    first = job.run("processes", workers=2, progress=False)
    assert sorted(first.failed) == [2, 3]
    (tmp / "in" / "in-000002.tar").write_bytes(good_shard_2)
    report = job.run("processes", workers=2, progress=False)
    assert sorted(report.failed) == [3] and report.done == 3
    page = tmp / "report.html"
    data = report_page.write(job.run_dir, str(page))
    return tmp, job, report, data, page


def test_the_numbers_of_the_page_are_the_runs(real_run):
    tmp, job, report, data, page = real_run
    s = data["summary"]
    assert (s["tasks"], s["done"], s["failed"], s["retried"]) == (4, 3, 1, 1)
    stats = report.stats
    assert (s["samples_in"], s["samples_out"], s["dropped"], s["skipped"], s["failed_samples"]) == \
        (stats.samples_in, stats.samples_out, stats.dropped, stats.skipped, stats.failed)
    assert (s["bytes_in"], s["bytes_out"], s["outputs"]) == (stats.bytes_in, stats.bytes_out, len(report.shards))
    assert data["dropped"]["skip_reasons"] == {"too dark": stats.skipped}
    assert data["failures"]["by_kind"] == {"input": 1} and data["failures"]["distinct"][0]["example_task"] == 3
    logged = dict(data["sample_errors"]["by_kind"])  # the failed task's log names where its shard broke
    assert logged["process ValueError"] == stats.failed and data["sample_errors"]["distinct"][0]["trace"]
    assert sum(data["timeline"]["running"]) > 0 and max(data["timeline"]["samples_per_s"]) > 0
    assert sum(data["durations"]["counts"]) == 3 and data["durations"]["slowest"][0]["inputs"]
    assert sum(w["tasks"] for w in data["workers"]["workers"]) == 3
    assert json.loads(json.dumps(data)) == data  # --json prints exactly these numbers


def test_the_page_in_chromium_shows_plots_numbers_and_hostile_keys_as_text(real_run, chromium):
    from PIL import Image, ImageStat

    tmp, job, report, data, page = real_run
    html = page.read_text()
    assert "<script>alert" not in html and "\x1b" not in html and "<b>bold" not in html
    keys = "[...document.querySelectorAll('[data-k]')].map(e => [e.dataset.k, e.dataset.v])"
    boxes = ("[...document.querySelectorAll('.plot')].map(e => {const r = e.getBoundingClientRect();"
             " return [e.id, r.left + scrollX, r.top + scrollY, r.width, r.height]})")
    text = "document.body.innerText"
    scripts = "document.scripts.length"
    trace = "document.querySelector('details pre').innerText"  # a traceback: shown as lines, not `\\n`
    result = chromium.open(page, (keys, boxes, text, scripts, trace))
    assert "Traceback (most recent call last):\n  File " in result.values[trace]
    assert result.errors == []  # no console error, no exception, nothing blocked by the page's CSP
    assert result.values[scripts] == 0
    shown = dict(result.values[keys])
    s = report.stats
    assert {k: shown[k] for k in ("samples_in", "samples_out", "dropped", "skipped", "failed_samples", "done",
                                  "failed", "tasks", "retried", "outputs")} == \
        {"samples_in": str(s.samples_in), "samples_out": str(s.samples_out), "dropped": str(s.dropped),
         "skipped": str(s.skipped), "failed_samples": str(s.failed), "done": str(report.done),
         "failed": str(len(report.failed)), "tasks": str(report.tasks), "retried": "1",
         "outputs": str(len(report.shards))}
    body = result.values[text]
    assert "<script>alert(1)</script>\\x1b[31mred" in body  # the key, as text, its escape made visible
    assert "<b>bold</b>\\x1b]0;title\\x07" in body and "too dark" in body and "not a tar" in body
    shot = Image.open(io.BytesIO(result.screenshot)).convert("RGB")
    plots = {box[0]: box[1:] for box in result.values[boxes]}
    assert {"plot-throughput", "plot-running", "plot-durations", "plot-workers"} <= set(plots)
    for name, (left, top, width, height) in plots.items():
        assert width > 200 and height > 80, name
        area = shot.crop((int(left), int(top), int(left + width), int(top + height)))
        ink = int((np.asarray(area) != 255).any(axis=2).sum())  # pixels that are not the white background
        assert ink > 0.02 * width * height and ImageStat.Stat(area).stddev[0] > 10, name  # drawn, not blank
    if os.environ.get("SHARDFLOW_WRITE_DOCS_SCREENSHOT"):  # the README's picture comes from this run
        top = shot.crop((0, 0, shot.width, min(shot.height, 1500)))
        top.thumbnail((900, 1200))
        top.quantize(colors=64).save(DOCS_SCREENSHOT, optimize=True)  # a small PNG for the repository


def test_report_cli_writes_the_page_and_the_same_numbers_as_json(real_run, tmp_path):
    tmp, job, report, data, page = real_run
    out = cli("report", job.run_dir, "-o", tmp_path / "r.html")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    as_json = json.loads(cli("report", job.run_dir, "--json").stdout)
    assert as_json["summary"] == data["summary"]
    final = cli("worker", "--run-dir", job.run_dir, "--finalize", "--report", tmp_path / "final.html")
    assert final.returncode == 65, final.stderr  # the run is incomplete (task 3 failed); the page is written
    assert f'data-k="samples_in" data-v="{report.stats.samples_in}"' in (tmp_path / "final.html").read_text()


def test_status_exit_code_says_a_task_failed(real_run):
    tmp, job, report, data, page = real_run
    status = cli("status", job.run_dir)
    assert status.returncode == 1 and "1 failed" in status.stdout
    assert cli("status", job.run_dir, "--check").returncode == 1
    with pytest.raises(RunFailed, match="1 tasks failed") as raised:
        report.raise_for_failures()
    assert raised.value.report is report
