"""The ONE command-line runner: `shardflow run` and every shell tool that runs a job (split, cat -o,
sort, map) run their job, print its report and exit through `run_and_report`.

It owns, once for all of them: which backends exist (`backend_names`, from the registry, so a backend
added with `register_backend` is a `--backend` choice everywhere), which options each backend takes
(`backend_options`: the keywords of its execute function), SIGTERM stopping a run like Ctrl-C, the
report printed (credentials scrubbed, data escaped) and the exit status:

    0    every task of the plan is done; samples dropped as failed (on_error skip/warn) are said in
         one line on stderr, they do not change the status
    1    the run ended with tasks failed or not done (listed; rerun the same command to retry)
    2    the job could not start: a bad job file, setting, spec or option, a refused plan, a held lease
    130  interrupted (Ctrl-C, SIGINT, SIGTERM): finished tasks stay done; rerun to resume

It also owns what an output named `-` (standard output) means for every command that writes a tar
(`stdout_tar_problem`): never a terminal, never rolled over into parts, and, for a job, the report goes
to stderr (stdout holds nothing but the tar). A stream, in or out (`-` as input or output), is never
"already done": the run directory records the run, but every run reads stdin / writes stdout whole, as
--redo; the driver owns that rule for the CLI and the Python API alike (job.rerun.Rerun.for_stream).

Click is not imported here: the flags are declared in cli/running.py, and the errors that keep a job
from starting are turned into one line (status 2) by the `guard` the command hands in.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator, Mapping

from shardflow.errors import JobError
from shardflow.job import backend_registry
from shardflow.storage import options as so
from shardflow.text import escape

EXIT_OK = 0
EXIT_FAILED = 1  # tasks failed or not done
EXIT_ERROR = 2  # the job could not start
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT / SIGTERM

STDOUT = "-"  # the output name that means standard output
_EXECUTE_ARGS = ("job", "tasks", "progress")  # what the driver passes every backend's execute()
_FAILED_IDS_SHOWN = 20


class BackendOptionError(JobError):
    """An option given to a backend that does not take it; `flag` is the command-line spelling."""

    def __init__(self, message: str, flag: str) -> None:
        super().__init__(message)
        self.flag = flag


def stdout_tar_problem(output: Any, *, rolls_over: bool = False, stream: Any = None) -> str | None:
    """Why a tar cannot be written to `output` when it is standard output (`-`), None when it can (or when
    `output` is not `-`): a terminal would show binary data (as gzip, refused; redirect or pipe it), and
    stdout is one stream, so a job that rolls over (maxcount/maxsize) would put its parts in files named
    `-_001`... instead. `stream`: what stands for stdout (sys.stdout)."""
    if output != STDOUT:
        return None
    if rolls_over:
        return ("-o - (standard output) is one shard and cannot roll over into parts: drop --maxcount/--maxsize, "
                "or write files (-o 'out/{name}-{part:04d}.tar')")
    stream = sys.stdout if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        terminal = False
    if terminal:
        return "refusing to write a tar to a terminal: redirect standard output (> out.tar) or pipe it (| tar tv)"
    return None


def _stdout_job(job: Any) -> bool:
    """Whether `job` writes its one output shard to standard output; refuses (JobError) what cannot."""
    spec = getattr(job, "spec", None)
    if getattr(spec, "outputs", None) != STDOUT:
        return False
    problem = stdout_tar_problem(STDOUT, rolls_over=bool(spec.maxcount or spec.maxsize))  # type: ignore[union-attr]
    if problem:
        raise JobError(problem)
    return True


def backend_names() -> list[str]:
    """Every backend a job can run on (the registry's, in its order)."""
    return list(backend_registry.BACKENDS)


def accepted_options(backend: str) -> frozenset[str] | None:
    """The options `backend` takes (its execute function's keywords), None when it takes any."""
    params = inspect.signature(backend_registry.backend(backend)).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.name not in _EXECUTE_ARGS
                     and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


def backend_options(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` without the ones not given (None), each checked against what `backend` takes."""
    given = {name: value for name, value in options.items() if value is not None}
    accepted = accepted_options(backend)
    for name in given:
        if accepted is not None and name not in accepted:
            flag = "--" + name.replace("_", "-")
            takers = [b for b in backend_names() if b != backend and _takes(b, name)]
            where = f"is for --backend {' or '.join(takers)}" if takers else f"is not an option of --backend {backend}"
            raise BackendOptionError(f"{flag} {where}", flag)
    return given


def _takes(backend: str, name: str) -> bool:
    try:
        accepted = accepted_options(backend)
    except (ImportError, JobError, AttributeError):  # a registered backend that cannot load here
        return False
    return accepted is None or name in accepted


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (docker stop, kill) stops a run like Ctrl-C: workers stopped, nothing half-written."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (tests calling main() from a thread)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_and_report(make_job: Callable[[], Any], backend: str, *, backend_opts: Mapping[str, Any] | None = None,
                   run_options: Mapping[str, Any] | None = None, storage_options: dict[str, Any] | None = None,
                   as_json: bool = False, guard: Callable[[], ContextManager[Any]] = nullcontext,
                   echo: Callable[..., None] = print, echo_err: Callable[[str], None] | None = None) -> int:
    """Make the job, run it on `backend`, print the report; returns the exit status (module doc).

    `backend_opts`: options only some backends take (None: not given), checked against `backend`;
    `run_options`: the driver's (force, progress, steal, limit, redo, ...); `debug` in them runs
    serially in this process with on_error=raise, outside `guard`, so the first failure reaches the user
    with its own traceback. `guard()` wraps making the job and running it: it turns what keeps a job from
    starting into one line and status 2.
    """
    err = echo_err or _stderr
    options = dict(run_options or {})
    debug = bool(options.get("debug"))
    if debug:  # where it runs is decided: this process (the backend options are for other backends)
        backend, options["progress"], backend_opts = "serial", False, None
    with sigterm_as_interrupt():
        with guard():
            options.update(backend_options(backend, backend_opts or {}))
            job = make_job()
            if _stdout_job(job):  # the tar owns stdout: the report goes to stderr (a stream, in or out, is
                echo = _print_stderr  # never "already done": the driver reruns it whole, job.rerun.Rerun.for_stream)
            if not debug:
                report = job.run(backend, **options)
        if debug:
            report = job.replace(on_error="raise").run(backend, **options)
    if options.get("limit"):
        err(f"shardflow: a trial on {options['limit']} samples per task; its outputs and run directory are in "
            f"{_shown(report.run_dir.rpartition('/')[0])}, not in the real run")
    echo(report_text(report, storage_options, as_json=as_json))
    status, message = outcome(report)
    if message:
        err(message)
    return status


def report_text(report: Any, storage_options: dict[str, Any] | None, *, as_json: bool = False) -> str:
    """The report as printed: JSON with URL credentials redacted, or text with every secret of
    `storage_options` scrubbed and anything that came from data escaped line by line."""
    if as_json:
        return so.scrub(json.dumps(so.redact_urls_deep(report.to_json()), indent=1, sort_keys=True), storage_options)
    return "\n".join(escape(line) for line in so.scrub(str(report), storage_options).split("\n"))


def outcome(report: Any) -> tuple[int, str | None]:
    """THE exit policy: (status, the line for stderr or None) of a finished run's report."""
    if report.interrupted:
        return EXIT_INTERRUPTED, (f"shardflow: interrupted with {report.done} of {report.tasks} tasks done; run the "
                                  "same command again to resume")
    status = f"shardflow status {_shown(report.run_dir)}"
    if report.failed:
        ids = sorted(report.failed)
        shown = ", ".join(map(str, ids[:_FAILED_IDS_SHOWN]))
        if len(ids) > _FAILED_IDS_SHOWN:
            shown += f", ... ({len(ids)} in all)"
        return EXIT_FAILED, (f"shardflow: {len(ids)} of {report.tasks} tasks failed (tasks {shown}); fix the cause "
                             f"and run the same command again to retry them ({status})")
    if not report.ok:
        return EXIT_FAILED, (f"shardflow: only {report.done} of {report.tasks} tasks are done; run the same command "
                             "again to finish")
    if report.stats.failed and _only_repeated_keys(report):
        return EXIT_OK, (f"shardflow: {report.stats.failed} samples were left out: their keys occur more than once "
                         f"in the inputs (see `{status}`); a rerun gives the same result: give each sample its own "
                         "key in the inputs")
    if report.stats.failed:
        return EXIT_OK, (f"shardflow: {report.stats.failed} samples failed and were left out; see `{status}`; "
                         "once the cause is fixed, rerun with --retry-failed to run their tasks again")
    return EXIT_OK, None


def _only_repeated_keys(report: Any) -> bool:
    """Whether every failed sample of the run is an input key met twice (task.process.REPEATED_INPUT_KEY):
    a property of the data, which --retry-failed cannot change. Only when the report's tracebacks account
    for every failure (else the usual hint)."""
    from shardflow.task.process import REPEATED_INPUT_KEY  # here: it imports numpy, every command imports this module

    traces = getattr(report, "tracebacks", None) or []
    return (sum(int(t.get("count", 1)) for t in traces) == report.stats.failed
            and all(REPEATED_INPUT_KEY in str(t.get("reason", "")) for t in traces))


def _shown(url: str) -> str:
    return escape(so.redact_urls(url))


def _print_stderr(*args: Any, **kwargs: Any) -> None:
    print(*args, **{**kwargs, "file": sys.stderr})


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
