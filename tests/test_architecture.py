"""The house rules of docs/architecture.md, checked on every run (the layers themselves are checked by
import-linter, `lint-imports`, in the test command):

- no import cycle between modules, apart from the imports the import-linter contract in pyproject.toml
  ignores (`ignore_imports`; none today);
- no module over MAX_MODULE_LINES lines (a failing test);
- functions over MAX_FUNCTION_LINES lines are REPORTED, not failed: `test_function_length_report` prints
  the longest ones as a table and warns once (in the warnings summary of every run).
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardflow"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
REPORT_ROWS = 20


def _contract_ignored_imports() -> set[tuple[str, str]]:
    """The (importer, imported) pairs the import-linter contracts of pyproject.toml allow against the
    layers: the only edges the cycle check may skip. Wildcards are not used there, so none are expanded."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    pairs = set()
    for contract in config.get("contracts", []):
        for line in contract.get("ignore_imports", []):
            importer, imported = (s.strip() for s in line.split("->"))
            pairs.add((importer, imported))
    return pairs


ALLOWED_UPWARD = _contract_ignored_imports()


class FunctionLengthReport(UserWarning):
    """Functions over MAX_FUNCTION_LINES lines: a report to act on, not a failure."""


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("shardflow", exclude_type_checking_imports=True)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), allowed edges removed."""
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if (m, i) not in ALLOWED_UPWARD}
             for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    graph = _graph()
    graph.add_import(importer="shardflow.errors", imported="shardflow.job.shard_job")  # errors -> job -> ... -> errors
    assert any("shardflow.errors" in c and "shardflow.job.shard_job" in c for c in _cycles(graph))


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "jobs_builtin" not in p.parts)


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_module_size(path: Path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.name} has {lines} lines (max {MAX_MODULE_LINES}): split it by concern"


def _function_lengths() -> list[tuple[int, str]]:
    found = []
    for path in _modules():
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{module}:{node.name}:{node.lineno}"))
    return sorted(found, reverse=True)


def test_function_length_report():
    """Prints the longest functions (see them with `-rA` or `-s`); warns when any is over the cap."""
    lengths = _function_lengths()
    assert lengths, "no functions found: is PACKAGE right?"
    over = [(n, name) for n, name in lengths if n > MAX_FUNCTION_LINES]
    print(f"\nlongest functions (cap {MAX_FUNCTION_LINES} lines, {len(over)} over it):")
    for n, name in lengths[:max(REPORT_ROWS, len(over))]:
        print(f"  {n:4d}  {'OVER ' if n > MAX_FUNCTION_LINES else '     '}{name}")
    if over:
        table = "\n".join(f"  {n:4d}  {name}" for n, name in over)
        warnings.warn(FunctionLengthReport(f"{len(over)} function(s) over {MAX_FUNCTION_LINES} lines "
                                           f"(a report, not a failure):\n{table}"), stacklevel=1)
