"""`shardflow tsv` on hostile values (issue 26 item 15) and without pyarrow (issue 29 item 13), run as
a user runs it (a subprocess): a huge text member, cells a spreadsheet would run as formulas."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import tomllib
from hypothesis import given
from hypothesis import strategies as st

import shardflow as sf
from shardflow.cli.tools_view import neutralise

ROOT = Path(__file__).resolve().parents[2]


def tsv(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardflow.cli", "tsv", *map(str, args)], cwd=cwd, timeout=300,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_a_huge_text_member_is_cut_in_bounded_memory(tmp_path):
    text = "数据\n" * 3_000_000  # 9 M characters, 21 MB of UTF-8, with newlines to escape
    with sf.TarWriter(str(tmp_path / "big.tar")) as w:
        w.write({"__key__": "a", "txt": text.encode()})
    # the peak RSS of the command alone: measured by a fresh parent that runs only it
    probe = ("import resource, subprocess, sys; "
             "done = subprocess.run(sys.argv[1:], stdout=open('out.tsv', 'w'), stderr=subprocess.PIPE); "
             "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.stderr.decode())")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "shardflow.cli", "tsv", "big.tar",
                             "-f", "txt", "--max-chars", "1000"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    code, peak_kib, stderr = result.stdout.split(" ", 2)
    assert code == "0", stderr
    row = (tmp_path / "out.tsv").read_text().splitlines()[1].split("\t")
    assert row[2].endswith(f"...[{len(text.strip()) - 1000} more characters]")
    assert len(row[2]) < 3000  # 1000 characters, escaped
    assert int(peak_kib) < 250_000  # the 9 M characters escaped one by one took 700+ MB


def test_csv_cells_that_would_run_as_formulas_are_neutralised_unless_raw(tmp_path):
    labels = ["=HYPERLINK(\"http://x\",\"y\")", "+1+1", "-1.5", "@SUM(A1:A9)", "plain", "42"]
    with sf.TarWriter(str(tmp_path / "f.tar")) as w:
        for i, label in enumerate(labels):
            w.write({"__key__": f"k{i}", "cls": label.encode()})
    safe = tsv("f.tar", "-f", "cls", "--format", "csv", "-o", "safe.csv", cwd=tmp_path)
    assert safe.returncode == 0, safe.stderr
    cells = [row["cls"] for row in csv.DictReader((tmp_path / "safe.csv").open())]
    assert cells == ["'=HYPERLINK(\"http://x\",\"y\")", "'+1+1", "-1.5", "'@SUM(A1:A9)", "plain", "42"]
    raw = tsv("f.tar", "-f", "cls", "--format", "csv", "-o", "raw.csv", "--raw-cells", cwd=tmp_path)
    assert raw.returncode == 0, raw.stderr
    assert [row["cls"] for row in csv.DictReader((tmp_path / "raw.csv").open())] == labels


def test_parquet_without_pyarrow_names_the_extra_and_the_extra_is_pinned(tmp_path):
    with sf.TarWriter(str(tmp_path / "p.tar")) as w:
        w.write({"__key__": "k", "cls": b"1"})
    blocker = tmp_path / "no-pyarrow" / "pyarrow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named pyarrow (hidden by this test)')\n")
    missing = tsv("p.tar", "--format", "parquet", "-o", "p.parquet", cwd=tmp_path,
                  env={"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])})
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "'.[tables]'" in missing.stderr and not (tmp_path / "p.parquet").exists()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("pyarrow") for req in extras["tables"])
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("pyarrow==")]
    assert len(pins) == 1
    done = tsv("p.tar", "--format", "parquet", "-o", "p.parquet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr and (tmp_path / "p.parquet").exists()


@given(cell=st.text(max_size=50))
def test_a_neutralised_cell_never_starts_a_formula_unless_a_plain_number(cell):
    out = neutralise(cell)
    if out.startswith(("=", "+", "-", "@", "\t", "\r")):
        float(out)  # a plain number such as -1.5: a spreadsheet reads it as a number
    assert out in (cell, "'" + cell)
