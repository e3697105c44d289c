"""Where the job's code came from, carried with the pickled job so tracebacks name the user's file.

cloudpickle sends a job file's functions (and a script's `__main__` functions) by value. Since
cloudpickle 3.1.3 it writes every such code object's file name as `<dynamic-code>` (for deterministic
payloads), so a worker's traceback said `File "<dynamic-code>", line 18` where 3.1.2 said
`File "buggy.py", line 18`, with no source line either way once the file is not on the worker. Which
file a traceback names must not depend on the pickler's version: the driver records (path, source) of
the function's module when it pickles the job (`capture`), and the worker puts the path back into the
code objects and the source into `linecache` (`restore`), before any task runs.
"""

from __future__ import annotations

import linecache
import sys
import types
from typing import Any

MAX_SOURCE_BYTES = 1 << 20  # a job file or script is small; a larger one is named without its lines
_DYNAMIC = "<dynamic-code>"


def capture(fn: Any) -> dict[str, str] | None:
    """{"module", "path", "source"} of the module that defines `fn` (a function or a callable
    instance), when that module is a file; None for code with no file (a REPL, a notebook cell)."""
    module_name = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", None)
    module = sys.modules.get(module_name or "")
    path = getattr(module, "__file__", None)
    if module is None or not path or not str(path).endswith(".py"):
        return None
    source = linecache.getlines(path, getattr(module, "__dict__", None))
    text = "".join(source)
    if len(text) > MAX_SOURCE_BYTES:
        text = ""
    return {"module": module.__name__, "path": str(path), "source": text}


def restore(fn: Any, origin: dict[str, str] | None) -> None:
    """Name `origin`'s file in the code objects of `fn`, of the functions and classes its globals hold
    from the same module, and make their source lines known to tracebacks (linecache)."""
    if not origin:
        return
    path = origin["path"]
    if origin.get("source") and not _readable(path):
        lines = origin["source"].splitlines(keepends=True)
        linecache.cache[path] = (len(origin["source"]), None, lines, path)  # mtime None: checkcache keeps it
    seen: set[int] = set()
    for target in _related(fn, origin["module"]):
        if id(target) not in seen:
            seen.add(id(target))
            _rename(target, path)


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def _related(fn: Any, module: str) -> list[Any]:
    """fn, its class (for callable instances) and what its globals hold that the same module defined."""
    roots: list[Any] = [fn] if isinstance(fn, types.FunctionType) else [type(fn)]
    found = list(roots)
    for root in roots:
        if isinstance(root, types.FunctionType):
            namespace = root.__globals__.values()
        else:
            namespace = [getattr(m, "__globals__", {}) for m in vars(root).values()]
            namespace = [v for g in namespace for v in g.values()]
        found.extend(v for v in list(namespace)
                     if isinstance(v, (types.FunctionType, type)) and getattr(v, "__module__", None) == module)
    return found


def _rename(target: Any, path: str) -> None:
    if isinstance(target, types.FunctionType):
        if target.__code__.co_filename == _DYNAMIC:
            target.__code__ = _renamed(target.__code__, path)
        return
    for member in vars(target).values():
        function = getattr(member, "__func__", member)  # staticmethod / classmethod
        if isinstance(function, types.FunctionType) and function.__code__.co_filename == _DYNAMIC:
            function.__code__ = _renamed(function.__code__, path)


def _renamed(code: types.CodeType, path: str) -> types.CodeType:
    """`code` (and the code objects nested in it: inner functions, comprehensions) with file `path`."""
    consts = tuple(_renamed(c, path) if isinstance(c, types.CodeType) and c.co_filename == _DYNAMIC else c
                   for c in code.co_consts)
    return code.replace(co_filename=path, co_consts=consts)
