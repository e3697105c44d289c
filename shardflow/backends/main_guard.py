"""Worker processes that import the driver's main script: the one check, and its one-line message, for
every backend that starts local worker processes (the processes backend's pool, Dask's LocalCluster).

Python's spawn and forkserver start methods (multiprocessing; Dask's nannies use spawn) run the main
script again in each new process, as `__mp_main__`, before they run anything. A script that calls
`job.run(...)` at its top level, outside `if __name__ == "__main__":`, then runs the job again in every
worker: the pool's workers die before their first task and the run fails task by task; a LocalCluster's
nannies print a traceback each and end in "Nanny failed to start" (~240 lines). Code piped to `python -`
cannot be imported at all ('<stdin>' is no file). Both are told here, in one line, before any process
starts. The check reads the script's syntax tree: the line of the script's top-level code that called
the run must lie inside an `if __name__ == "__main__":` block. When it cannot tell (no script, the call
came from a thread, the file is gone), it says nothing: a false alarm would stop a run that works.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType, ModuleType

GUARD = 'if __name__ == "__main__":'


class MainGuardMissing(SystemExit):
    """The script cannot run this backend's worker processes. A SystemExit: the process ends with status 1
    and the one line, with no traceback (the script's structure is at fault, not a call a traceback could
    point to; and the check fires only in a script run at its top level, never in a notebook or library)."""


def check_main_guard(backend: str) -> None:
    """End the script (MainGuardMissing, one line) when the worker processes `backend` is about to start
    would import a main script that runs the job again, or cannot import it (code read from standard input)."""
    problem = main_guard_problem(sys._getframe(1))
    if problem is not None:
        raise MainGuardMissing(f"shardflow: the {backend} starts worker processes, and {problem}")


def main_guard_problem(frame: FrameType | None = None) -> str | None:
    """What is wrong with the main script for worker processes that import it, or None (fine, or unknown).

    `frame`: where to start looking up the stack for the main script's top-level code (the caller's)."""
    main = sys.modules.get("__main__")
    path = _imported_main_path(main)
    if main is None or path is None:
        return None
    if not os.path.isfile(path):  # `python -`: the workers' import of '<stdin>' fails
        return (f"each imports the main script, which is {path}, no file: save the code to a file and put the "
                f"code that runs the job under `{GUARD}`")
    line = _top_level_line(main, path, frame or sys._getframe(1))
    if line is None or _under_guard(path, line):
        return None
    return (f"each imports the main script {path}, whose line {line} would run the job again in each of them: "
            f"put the code that runs the job under `{GUARD}`")


def startup_hint() -> str:
    """Said when worker processes died before starting any task: what the main script may have to do with
    it; nothing when the call that runs the job is seen under the guard (the script is not the cause)."""
    main = sys.modules.get("__main__")
    path = _imported_main_path(main)
    if main is None or path is None:
        return ""
    line = _top_level_line(main, path, sys._getframe(1)) if os.path.isfile(path) else None
    if line is not None and _under_guard(path, line):
        return ""
    return (f"; worker processes import the main script ({path}) first: if it runs the job, put that code "
            f"under `{GUARD}`")


def _imported_main_path(main: ModuleType | None) -> str | None:
    """The file spawned processes run again as `__mp_main__` (multiprocessing.spawn.get_preparation_data):
    a script run by path; a module run with -m, unless it is a package's __main__ (multiprocessing skips
    those); None for an interactive session, a notebook or `python -c` (nothing is imported)."""
    path = getattr(main, "__file__", None)
    if not path:
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None
    return path


def _top_level_line(main: ModuleType, path: str, frame: FrameType | None) -> int | None:
    """The line of the main script's top-level code that led to this call (None: not called from there)."""
    where = os.path.realpath(path)
    while frame is not None:
        if (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)
                and os.path.realpath(frame.f_code.co_filename) == where):
            return frame.f_lineno
        frame = frame.f_back
    return None


def _under_guard(path: str, line: int) -> bool:
    """Whether `line` of the script lies in the body of an `if __name__ == "__main__":` (True when the file
    cannot be read or parsed: unknown is not a problem)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_guard(node.test) and node.body:
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return True
    return False


def _is_guard(test: ast.expr) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
