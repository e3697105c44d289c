"""The fingerprint of a job's code, and the default run directory name that follows from a job.

A rerun whose `process()` changed must not report "4/4 tasks done" over outputs of the old code:
`prepare()` stores `code_fingerprint(job)` in plan.json (key "code") and `job.guard.check_code`
compares it on every rerun. What goes in, from the most to the least precise source available:

- a job file (a module loaded by `job.jobfile`): the sha256 of the file's source;
- otherwise the function's qualified name and its source (`inspect.getsource`), or, when there is no
  source (a lambda typed at a prompt, a pickled function), its bytecode and constants; and, for a
  function defined in the user's own script or module (not in an installed package), the source of
  that whole module: a module-level constant or helper the function reads is covered too;
- a `functools.partial`: the digest of the function it wraps and its arguments (reprs without memory
  addresses, so an identical rerun gives the same digest);
- PARAMS (the job's `params`), as canonical JSON.

Not covered: helpers in OTHER modules the function imports (a job file is hashed whole, which is why
job files are the recommended way to run production jobs), data files it reads, installed libraries.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import sys
import types
from typing import TYPE_CHECKING, Any

from shardflow.rundir.layout import own_run_dir_name

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

JOB_MODULE_PREFIX = "_shardflow_job_"  # job.jobfile names job-file modules so


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _bytecode(code: types.CodeType) -> bytes:
    """The bytecode of a code object and of the code objects among its constants (nested functions)."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_bytecode(const) if isinstance(const, types.CodeType) else repr(const).encode())
    return b"\0".join(parts)


def _job_file(fn: Any) -> tuple[str, str] | None:
    """(path, source sha256) of the job file `fn` was defined in, when it came from one."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if module is None or not path or not module.__name__.startswith(JOB_MODULE_PREFIX):
        return None
    try:
        with open(path, "rb") as f:
            return path, _sha(f.read())
    except OSError:
        return None


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(value: Any) -> str:
    """repr without memory addresses (`<function f at 0x7f..>` differs in every process)."""
    return _ADDRESS.sub("", repr(value))


def _function_digest(fn: Any) -> tuple[str, str]:
    """(how, sha256) of the function alone: its source where Python has it, else its bytecode."""
    if isinstance(fn, functools.partial):
        how, digest = _function_digest(fn.func)
        arguments = _stable_repr((fn.args, sorted(fn.keywords.items())))
        return f"partial of {how}", _sha(f"{digest}\n{arguments}")
    target = getattr(fn, "__func__", fn)
    try:
        return "source", _sha(inspect.getsource(target))
    except (OSError, TypeError):
        code = getattr(target, "__code__", None) or getattr(type(target).__call__, "__code__", None)
        if code is None:
            return "name", _sha(_stable_repr(target))
        return "bytecode", _sha(_bytecode(code))


def _user_module_source(fn: Any) -> str | None:
    """sha256 of the source of the user's module (a script, `__main__`, a module of their project) that
    defines `fn`; None for installed packages (site-packages, shardflow itself) and where there is no file."""
    target = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", fn)
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    real = os.path.realpath(path)
    if os.sep + "site-packages" + os.sep in real or os.sep + "dist-packages" + os.sep in real or \
            real.startswith(_SHARDFLOW_DIR):
        return None
    try:
        with open(real, "rb") as f:
            return _sha(f.read())
    except OSError:
        return None


_SHARDFLOW_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def code_fingerprint(job: "ShardJob") -> dict[str, Any]:
    """What identifies the code of `job` (a ShardJob): JSON-safe, with one overall `fingerprint`."""
    fn = job.fn
    qualname = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    record: dict[str, Any] = {"fn": qualname}
    job_file = _job_file(fn)
    if job_file is not None:
        record["job_file"], record["job_file_sha256"] = job_file
        qualname = getattr(fn, "__qualname__", "?")  # the module's name embeds the file's path
    else:
        record["fn_digest_from"], record["fn_sha256"] = _function_digest(fn)
        module = _user_module_source(fn)
        if module is not None:
            record["module_sha256"] = module
    record["params_sha256"] = _sha(json.dumps(job.params, sort_keys=True, default=repr))
    parts = [qualname, record.get("job_file_sha256") or record["fn_sha256"], record["params_sha256"]]
    record["fingerprint"] = _sha("\n".join(parts + [record.get("module_sha256", "")]))[:16]
    # what a release that did not hash the module recorded: such a plan is not refused for that alone
    record["fn_fingerprint"] = _sha("\n".join(parts))[:16]
    return record


def same_code(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the code recorded in a plan (`old`) is the code of `new` (code_fingerprint)."""
    if old.get("fingerprint") == new["fingerprint"]:
        return True
    older = "module_sha256" not in old and "fn_fingerprint" not in old  # recorded before modules were hashed
    return older and old.get("fingerprint") == new["fn_fingerprint"]


def code_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed between two code fingerprints, in a few words."""
    changed = []
    if old.get("fn") != new.get("fn"):
        changed.append(f"function {old.get('fn')} -> {new.get('fn')}")
    if old.get("job_file_sha256") != new.get("job_file_sha256") and new.get("job_file"):
        changed.append(f"job file {new['job_file']} changed")
    if old.get("fn_sha256") != new.get("fn_sha256") and new.get("fn_sha256"):
        changed.append(f"the {new.get('fn_digest_from')} of {new.get('fn')} changed")
    if old.get("module_sha256") != new.get("module_sha256") and new.get("module_sha256") and old.get("module_sha256"):
        changed.append(f"the module that defines {new.get('fn')} changed")
    if old.get("params_sha256") != new.get("params_sha256"):
        changed.append("PARAMS changed")
    return ", ".join(changed) or "the code changed"


def default_run_dir_name(job: "ShardJob") -> str:
    """`_shardflow-<job name>-<8 hex>`: a name of its own for each job writing into one output directory.

    The hex digits hash the job's name and output spec (not its code: a code change must be found in the
    same run directory, not start a new one silently).
    """
    outputs = job.outputs if isinstance(job.outputs, str) else list(job.outputs)
    return own_run_dir_name(job.name, _sha(json.dumps([job.name, outputs]))[:8])
