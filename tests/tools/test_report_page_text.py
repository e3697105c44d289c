"""The report page's multi-line text: tracebacks and task errors keep their lines, each line escaped.

A real run (serial, in process) whose job raises on every sample with a message holding a terminal
escape, `<script>` and a newline; the page's <pre> blocks are read back with html.parser (what a
browser shows as text), so the test sees the characters a reader would see.
"""

from __future__ import annotations

import tarfile
from html.parser import HTMLParser
from io import BytesIO

import pytest

from shardflow.job.shard_job import ShardJob
from shardflow.tools import report_page

pytest.importorskip("matplotlib", reason="the report page's plots need matplotlib (the `report` extra)")

HOSTILE = "<script>alert(1)</script>\x1b[31mred\nsecond line\x1b]0;t\x07"


def fail_hostile(sample: dict) -> dict:
    raise ValueError(HOSTILE)


class _Pres(HTMLParser):
    """The text of each <pre> and of each <summary> of a page, as a browser shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.pres: list[str] = []
        self.summaries: list[str] = []
        self._into: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("pre", "summary"):
            self._into = self.pres if tag == "pre" else self.summaries
            self._into.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "summary"):
            self._into = None

    def handle_data(self, data: str) -> None:
        if self._into is not None:
            self._into[-1] += data


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """The page of a run whose every sample failed with HOSTILE."""
    tmp_path = tmp_path_factory.mktemp("report-text")
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for name in ("s0.txt", "s1.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, BytesIO(b"A"))
    job = ShardJob(fail_hostile, str(tmp_path / "a.tar"), str(tmp_path / "out" / "{name}.tar"))
    job.run("serial", progress=False)
    return report_page.build(job.run_dir, samples=0)[1]


def test_tracebacks_keep_their_lines_and_stay_escaped(page):
    assert "\x1b" not in page and "\x07" not in page and "<script>alert" not in page
    parsed = _Pres()
    parsed.feed(page)
    trace = next(p for p in parsed.pres if p.startswith("Traceback"))
    assert "Traceback (most recent call last):\n  File " in trace  # real lines, not one line of `\n`
    assert "\\n" not in trace and "red\nsecond line" in trace  # the message's own newline is a line too
    assert "<script>alert(1)</script>\\x1b[31mred" in trace and "\\x07" in trace
    task_error = parsed.pres[0]  # the failed task's error (a user bug: the same error on every sample)
    assert "ValueError" in task_error and "\\x1b[31mred" in task_error and "<script>alert" in task_error


def test_sample_error_summary_names_the_type_once(page):
    parsed = _Pres()
    parsed.feed(page)
    summary = next(s for s in parsed.summaries if "[process]" in s)
    assert "ValueError: <script>" in summary and "ValueError: ValueError" not in summary
    assert "red\\nsecond" in summary  # a summary is one line: its newline shown as `\n`
