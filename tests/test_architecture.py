"""The house rules of docs/architecture.md, checked on every run (the layers themselves are checked by
import-linter, `lint-imports`, in the test command):

- no import cycle between modules, apart from the lazy front ends named in pyproject.toml;
- no module over MAX_MODULE_LINES lines and no function over MAX_FUNCTION_LINES lines, except the few
  listed below, each with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "shardflow"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# ShardJob's lazy front ends (imported inside the method, on first call): the only upward imports.
ALLOWED_UPWARD = {
    ("shardflow.job.shard_job", "shardflow.backends"),
    ("shardflow.job.shard_job", "shardflow.cluster.manifests"),
}
# "module:function" -> why it may be longer than MAX_FUNCTION_LINES
LONG_FUNCTIONS: dict[str, str] = {}  # none today


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


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_module_and_function_sizes(path: Path):
    text = path.read_text()
    assert text.count("\n") <= MAX_MODULE_LINES, f"{path.name} has {text.count(chr(10))} lines: split it by concern"
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            name = f"{module}:{node.name}"
            if length > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS:
                raise AssertionError(f"{name} is {length} lines (max {MAX_FUNCTION_LINES}): split it, or add it to "
                                     "LONG_FUNCTIONS with the reason")
