"""`shardflow report`: one self-contained HTML page (or JSON) about a run, from its run directory.

The page needs no network and runs no script: plots are inline SVG (tools/report_plots), thumbnails
are data URIs, the style is inline, and a Content-Security-Policy forbids loading anything else.
Every piece of text that came from data (keys, labels, shard URLs, error messages, tracebacks,
worker names) goes through `_t`: escaped for a terminal first (shardflow.text: control characters and
escape sequences shown as `\\x1b`), then for HTML, so a key `<script>` is shown as those characters;
multi-line text (tracebacks, task errors) goes through `_pre`, the same line by line, its lines kept.
Numbers carry `data-k="name"` so tests (and scrapers) can read them back.
"""

from __future__ import annotations

import html
import json
from typing import Any

from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.status import typed_reason
from shardflow.rundir.tracebacks import printable
from shardflow.storage.publish import open_atomic
from shardflow.text import safe, truncate
from shardflow.tools import report_plots as plots
from shardflow.tools.output_temps import remove_dead_writers_temps, writer_tag
from shardflow.tools.report_data import collect
from shardflow.tools.report_samples import before_after

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px 24px;color:#222}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.muted{color:#666}.cards{display:flex;flex-wrap:wrap;gap:8px}.card{border:1px solid #ddd;border-radius:6px;
padding:6px 10px;min-width:120px}.card b{display:block;font-size:18px}table{border-collapse:collapse;margin:6px 0}
td,th{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f6f6f6;padding:8px;overflow:auto;
white-space:pre-wrap;word-break:break-all;font-size:12px;max-height:360px}.plot svg{width:100%;height:auto}
.sheet{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:12px}.pair{display:flex;gap:8px;
border:1px solid #eee;padding:6px}.tile{width:140px}.tile img{max-width:128px;max-height:128px;display:block;
background:#eee}.tile .k{font:11px monospace;word-break:break-all}.bad{color:#b00020}.ok{color:#0a7a2f}
"""


def _t(value: Any, limit: int | None = 2000) -> str:
    """Data text for the page: terminal-escaped (control characters visible), truncated, HTML-escaped."""
    return html.escape(safe("" if value is None else value, limit), quote=True)


def _pre(text: Any, limit: int) -> str:
    """Multi-line data text (a traceback, an error) in a <pre>: cut to `limit` characters, each line's
    control characters escaped (tracebacks.printable keeps the newlines, which a <pre> shows as lines;
    text.safe would write them as `\\n`), then HTML-escaped."""
    return f"<pre>{html.escape(printable(truncate(str(text or ''), limit)), quote=True)}</pre>"


def _n(key: str, value: Any, fmt: str = "{:,}") -> str:
    shown = "–" if value is None else (fmt.format(value) if isinstance(value, (int, float)) else _t(value))
    return f'<span data-k="{key}" data-v="{_t(value, 100)}">{shown}</span>'


def _card(label: str, key: str, value: Any, fmt: str = "{:,}") -> str:
    return f'<div class="card"><b>{_n(key, value, fmt)}</b><span class="muted">{label}</span></div>'


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    th = "".join(f'<th class="{"n" if i in numeric else ""}">{h}</th>' for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _summary(d: dict[str, Any]) -> str:
    s = d["summary"]
    state = ("complete" if s["complete"] else f"has failed tasks ({s['failed']})" if s["failed"] else "incomplete")
    cards = [
        _card("tasks", "tasks", s["tasks"]), _card("done", "done", s["done"]),
        _card("failed tasks", "failed", s["failed"]),
        _card("running", "running", s["running"]), _card("pending", "pending", s["pending"]),
        _card("retried", "retried", s["retried"]),
        _card("input shards", "inputs", s["inputs"]), _card("output shards", "outputs", s["outputs"]),
        _card("samples in", "samples_in", s["samples_in"]), _card("samples out", "samples_out", s["samples_out"]),
        _card("dropped (filtered)", "dropped", s["dropped"]), _card("skipped", "skipped", s["skipped"]),
        _card("failed samples", "failed_samples", s["failed_samples"]),
        _card("MB read", "mb_in", s["bytes_in"] / 1e6, "{:,.1f}"), _card("MB written", "mb_out", s["bytes_out"] / 1e6,
                                                                          "{:,.1f}"),
        _card("wall s (first start to last end)", "wall_seconds", s["wall_seconds"], "{:,.1f}"),
        _card("CPU s (done tasks)", "cpu_seconds", s["cpu_seconds"], "{:,.2f}"),
        _card("samples/s", "samples_per_s", s["samples_per_s"], "{:,.1f}"),
    ]
    cls = "ok" if s["complete"] else "bad"
    gone = f'<p class="bad" data-k="driver_gone">{_t(d["driver_gone"])}</p>' if d.get("driver_gone") else ""
    return (f'<p>State: <b class="{cls}" data-k="state">{_t(state)}</b></p>{gone}'
            f'<div class="cards">{"".join(cards)}</div>')


def _plots(d: dict[str, Any]) -> str:
    parts = []
    if d["timeline"]["t"]:
        parts.append('<h2>Throughput over time</h2><div class="plot" id="plot-throughput">'
                     + plots.throughput(d["timeline"]) + "</div>")
        parts.append('<h2>Tasks running over time</h2><div class="plot" id="plot-running">'
                     + plots.running(d["timeline"]) + "</div>")
    hist = d["durations"]
    if hist["counts"]:
        parts.append('<h2>Task durations</h2><div class="plot" id="plot-durations">' + plots.durations(hist) + "</div>")
        names = d["workers"]["names"]
        rows = [[_n(f"slow_task_{i}", r["task"]), _n(f"slow_seconds_{i}", r["seconds"], "{:,.3f}"),
                 f'{r["samples"]:,}', _t(names[r["worker_index"]] if r["worker_index"] < len(names) else "?"),
                 "<br>".join(_t(u, 300) for u in r["inputs"][:3])] for i, r in enumerate(hist["slowest"])]
        parts.append("<p>Slowest tasks:</p>"
                     + _table(["task", "seconds", "samples", "worker", "inputs"], rows, {0, 1, 2}))
    workers = d["workers"]
    if workers["workers"]:
        parts.append('<h2>Per worker and host</h2><div class="plot" id="plot-workers">'
                     + plots.per_worker(workers["workers"], "worker") + "</div>")
        if len(workers["hosts"]) > 1:
            parts.append('<div class="plot" id="plot-hosts">' + plots.per_worker(workers["hosts"], "host") + "</div>")
        rows = [[_t(r["name"]), f'{r["tasks"]:,}', f'{r["samples"]:,}', f'{r["mb_in"]:,.1f}',
                 f'{r["busy_seconds"]:,.1f}', f'{r["cpu_seconds"]:,.1f}',
                 "–" if r["samples_per_busy_s"] is None else f'{r["samples_per_busy_s"]:,.1f}']
                for r in workers["workers"][:50]]
        parts.append(_table(["worker", "tasks", "samples", "MB read", "busy s", "CPU s", "samples/busy s"], rows,
                            {1, 2, 3, 4, 5, 6}))
    return "".join(parts)


def _failures(d: dict[str, Any]) -> str:
    f, e, dropped = d["failures"], d["sample_errors"], d["dropped"]
    parts = ["<h2>Failed tasks</h2>"]
    if not f["count"]:
        parts.append('<p class="ok">No task failed.</p>')
    else:
        kinds = [[_t(k), _n(f"failed_kind_{k}", v)] for k, v in f["by_kind"].items()]
        parts.append(_table(["kind", "tasks"], kinds, {1}))
        if f["read"] < f["count"]:
            parts.append(f'<p class="muted">Distinct errors of the last {f["read"]} of {f["count"]} failed tasks:</p>')
        for g in f["distinct"]:
            parts.append(f'<p><b>{g["count"]:,}×</b> [{_t(g["kind"])}] e.g. task {g["example_task"]}, inputs '
                         f'{_t(", ".join(g["inputs"][:3]), 600)}</p>{_pre(g["error"], 6000)}')
    parts.append("<h2>Sample errors</h2>")
    if not e["count"]:
        parts.append('<p class="ok">No sample error logged.</p>')
    else:
        note = f' (in the last {e["logs_read"]} of {e["logs"]} error logs)' if e["logs_read"] < e["logs"] else ""
        parts.append(f'<p>{_n("sample_errors", e["count"])} logged{note}, by stage and type:</p>')
        parts.append(_table(["stage type", "count"], [[_t(k), f"{v:,}"] for k, v in e["by_kind"]], {1}))
        for t in e["distinct"]:
            parts.append(f'<details open><summary><b>{t["count"]:,}×</b> [{_t(t["stage"])}] '
                         f'{_t(typed_reason(t["type"], t["reason"]), 500)} — first: key '
                         f'<code>{_t(t["key"], 300)}</code> shard <code>{_t(t["shard"], 300)}</code> '
                         f'(task {_t(t["task"])})</summary>'
                         f'{_pre(t["trace"], 8000)}</details>')
    parts.append("<h2>Dropped samples by reason</h2>")
    rows = [["filtered (the job returned None)", _n("dropped_filtered", dropped["filtered"])]]
    rows += [[f"skipped: {_t(k)}", f"{v:,}"] for k, v in dropped["skip_reasons"].items()]
    if dropped["skipped"] and not dropped["skip_reasons"]:
        rows.append(["skipped (reasons not read)", f'{dropped["skipped"]:,}'])
    rows += [[f"failed: {_t(k)}", f"{v:,}"] for k, v in dropped["fail_reasons"].items()]
    if dropped["failed"] and not dropped["fail_reasons"]:
        rows.append(["failed (see sample errors)", _n("dropped_failed", dropped["failed"])])
    sampled = ('<p class="muted">Skip reasons counted in the tasks that skipped last.</p>'
               if dropped["reasons_sampled"] else "")
    return "".join(parts) + _table(["reason", "samples"], rows, {1}) + sampled


def _tile(tile: dict[str, Any] | None, caption: str) -> str:
    if tile is None:
        return f'<div class="tile"><div class="muted">{caption}: not written (dropped)</div></div>'
    image = f'<img alt="" src="{tile["image"]}">' if tile.get("image") else '<div class="muted">no image</div>'
    key = _t(tile["key"], 300)
    return (f'<div class="tile"><div class="muted">{caption}</div>{image}<div class="k" data-key="{key}">{key}</div>'
            f'<div>{_t(tile["label"], 200)}</div></div>')


def _sheet(sheet: dict[str, Any]) -> str:
    if not sheet["pairs"]:
        return "<h2>Samples before and after</h2><p class=\"muted\">No done task with outputs yet.</p>"
    pairs = "".join(f'<div class="pair">{_tile(p["before"], "before")}{_tile(p["after"], "after")}</div>'
                    for p in sheet["pairs"])
    errors = "".join(f'<p class="bad">{_t(e)}</p>' for e in sheet["errors"])
    return (f'<h2>Samples before and after</h2><p class="muted">Task {sheet["task"]}: {_t(sheet["input"], 500)} → '
            f'{_t(sheet["output"], 500)}</p>{errors}<div class="sheet" id="sheet">{pairs}</div>')


def _settings(d: dict[str, Any]) -> str:
    def rows(table: dict[str, Any]) -> list[list[str]]:
        return [[_t(k), f"<code>{_t(json.dumps(v, sort_keys=True, default=str), 500)}</code>"]
                for k, v in sorted(table.items())]

    return ("<h2>Settings, code and versions</h2>" + _table(["setting", "value"], rows(d["job_settings"]))
            + _table(["code", "value"], rows(d["code"])) + _table(["version", "value"], rows(
                {**d["versions"], "shardflow (this report)": d["shardflow_version"]})))


def _running(d: dict[str, Any]) -> str:
    if not d["running"]:
        return ""
    rows = [[str(r["task"]), _t(r["worker"]), f'{r["seconds"]:,.0f}', *_beat_cells(r.get("beat"))]
            for r in d["running"]]
    return "<h2>Running now</h2>" + _table(["task", "worker", "seconds", "samples read", "samples/s",
                                            "last beat (s ago)", ""], rows, {0, 2, 3, 4, 5})


def _beat_cells(beat: dict[str, Any] | None) -> list[str]:
    """A running task's last beat (rundir.beats), numbers only; a stale one says so."""
    if not beat:
        return ["", "", "", ""]
    note = f'no progress for {beat["idle"]:,.0f} s (hung or killed?)' if beat["stale"] else ""
    return [f'{beat["samples_in"]:,}', f'{beat["rate"]:,.1f}', f'{beat["age"]:,.0f}', note]


def render(d: dict[str, Any], sheet: dict[str, Any]) -> str:
    """The page's HTML for the numbers `d` (report_data.collect) and the sheet (report_samples)."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>shardflow report: {_t(d["job"], 100)}</title><style>{STYLE}</style></head><body>'
            f'<h1>Run of job {_t(d["job"], 200)}</h1><p class="muted">{_t(d["run_dir"], 500)} · generated '
            f'{_t(d["generated"])} · shardflow {_t(d["shardflow_version"])} · code fingerprint '
            f'<code data-k="fingerprint">{_t(d["code"].get("fingerprint"))}</code></p>'
            + _summary(d) + _running(d) + _plots(d) + _failures(d) + _sheet(sheet) + _settings(d)
            + "</body></html>")


def build(url: str, storage_options: dict[str, Any] | None = None, *, samples: int = 6) -> tuple[dict[str, Any], str]:
    """(numbers, page) for the run directory at `url`."""
    data = collect(url, storage_options)
    run_dir = RunDir(url, storage_options)
    done = [] if samples <= 0 else data["summary"]["first_done"]
    sheet = before_after(run_dir, done, samples, storage_options) if done else {"task": None, "pairs": [], "errors": []}
    return data, render(data, sheet)


def write(url: str, output: str, storage_options: dict[str, Any] | None = None, *, as_json: bool = False,
          samples: int = 6, output_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the page (or, with as_json, the numbers) to `output` atomically; returns the numbers."""
    if as_json:
        data = collect(url, storage_options)
        payload = json.dumps(data, indent=1, sort_keys=True).encode()
    else:
        data, page = build(url, storage_options, samples=samples)
        payload = page.encode()
    remove_dead_writers_temps([output])  # a killed earlier run's temp of this page (tools.output_temps)
    out = open_atomic(output, output_options, tag=writer_tag())
    try:
        out.write(payload)
    except BaseException:
        out.abort()
        raise
    out.commit()
    return data
