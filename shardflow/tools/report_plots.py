"""The report page's plots: matplotlib figures rendered as inline SVG (the `report` extra).

Why matplotlib: it is the plotting library every Python data team already has, it renders offline
to SVG with no JavaScript (the page opens with no network and nothing to execute), and its SVG
keeps text as text. Each figure gets its own id salt, so several SVGs inline in one page never share
a clip-path id. Only numbers from tools/report_data reach a plot; names (workers) are drawn as
tick labels that matplotlib writes XML-escaped.
"""

from __future__ import annotations

import io
from typing import Any, Callable

WIDTH, HEIGHT = 7.2, 2.6  # inches at 96 dpi in the page
BLUE, ORANGE, GREEN, GREY = "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # the one optional dependency of the page
        raise ImportError("the report page draws its plots with matplotlib: pip install 'shardflow[report]' "
                          "(or pass --json for the numbers alone)") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _svg(name: str, draw: Callable[[Any, Any], None], height: float = HEIGHT) -> str:
    """Draw on a fresh figure and return its <svg> element (no XML prolog, no fixed pixel size)."""
    plt = _pyplot()
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"shardflow-{name}",
                                "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}):
        fig, ax = plt.subplots(figsize=(WIDTH, height), dpi=96)
        try:
            draw(fig, ax)
            fig.tight_layout()
            out = io.StringIO()
            fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
        finally:
            plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]


def throughput(timeline: dict[str, Any]) -> str:
    def draw(fig: Any, ax: Any) -> None:
        ax.plot(timeline["t"], timeline["samples_per_s"], color=BLUE, label="samples/s")
        ax.fill_between(timeline["t"], timeline["samples_per_s"], color=BLUE, alpha=0.15)
        ax.set_xlabel("seconds since the first task started")
        ax.set_ylabel("samples/s", color=BLUE)
        ax.set_ylim(bottom=0)
        right = ax.twinx()
        right.plot(timeline["t"], timeline["mb_in_per_s"], color=ORANGE, label="MB/s read")
        right.plot(timeline["t"], timeline["mb_out_per_s"], color=GREEN, linestyle="--", label="MB/s written")
        right.set_ylabel("MB/s")
        right.set_ylim(bottom=0)
        right.spines["right"].set_visible(True)
        lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        ax.legend(lines, [line.get_label() for line in lines], loc="upper center", fontsize=8, frameon=True,
                  framealpha=0.8)

    return _svg("throughput", draw)


def running(timeline: dict[str, Any]) -> str:
    def draw(fig: Any, ax: Any) -> None:
        ax.step(timeline["t"], timeline["running"], where="mid", color=BLUE)
        ax.fill_between(timeline["t"], timeline["running"], step="mid", color=BLUE, alpha=0.2)
        ax.set_xlabel("seconds since the first task started")
        ax.set_ylabel("tasks running (mean)")
        ax.set_ylim(bottom=0)

    return _svg("running", draw)


def durations(hist: dict[str, Any]) -> str:
    def draw(fig: Any, ax: Any) -> None:
        edges, counts = hist["edges"], hist["counts"]
        widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
        ax.bar(edges[:-1], counts, width=widths, align="edge", color=BLUE, edgecolor="white", linewidth=0.5)
        for value, label, color in ((hist["median"], "median", GREEN), (hist["p95"], "p95", ORANGE)):
            ax.axvline(value, color=color, linestyle="--", linewidth=1, label=f"{label} {value:g} s")
        ax.set_xlabel("task duration (s)")
        ax.set_ylabel("tasks")
        ax.legend(fontsize=8, frameon=False)

    return _svg("durations", draw)


def per_worker(rows: list[dict[str, Any]], what: str, limit: int = 20) -> str:
    """Samples per busy second of each worker (or host), the busiest `limit`."""
    shown = rows[:limit]

    def draw(fig: Any, ax: Any) -> None:
        names = [r["name"] if len(r["name"]) <= 40 else r["name"][:39] + "…" for r in shown][::-1]
        values = [r["samples_per_busy_s"] or 0 for r in shown][::-1]
        ax.barh(range(len(names)), values, color=BLUE)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel(f"samples per busy second, per {what}")

    return _svg(f"per-{what}", draw, height=max(1.6, 0.6 + 0.22 * len(shown)))
