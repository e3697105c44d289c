"""What every `shardflow` command shares: one-line errors, exit codes and --storage-option.

A failure a user can expect (a bad spec, an unreachable bucket, a refused plan) is one line on stderr,
`shardflow: error: ...`, with credentials scrubbed, never a traceback. Exit codes: 0 success, 1 the
work finished with failures (or an inspection failed), 2 a job could not start, 130 interrupted (the
commands that run a job: tools/runner.py).

A flag that sets a job setting (--maxcount, --on-error, --run-dir, ...) is made by `setting_option`
from the JobSpec field (task/spec.py): its help, default and type are the field's, never restated here.

Flags mean the same in every command: `-i/--inputs`, `-o/--outputs` (or `-o/--output`: what the
command writes), `-S/--storage-option KEY=VALUE`, `-w/--workers`, `-b/--backend`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import click

from shardflow.errors import ShardflowError
from shardflow.storage import options as so
from shardflow.task.spec import JobSpec, setting_default, setting_help
from shardflow.text import safe

# the exit status of a job's run is the runner's policy (tools/runner.py); the other commands use the
# same numbers: 1 also means an inspection or manifest command failed
from shardflow.tools.runner import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401

STORAGE_OPTION_HELP = (
    "fsspec storage option (repeatable): key=value, dotted.key=value for nested options, PREFIX:key=value "
    "to scope one to a URL prefix (s3://bucket:anon=true); values are JSON when they parse as JSON; "
    "${VAR} reads the environment"
)


class Fail(click.ClickException):
    """One line on stderr (`shardflow: error: ...`) and the exit status given."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        # one line, whatever the message quotes from data (names, keys, URLs)
        click.echo(f"shardflow: error: {safe(self.format_message(), limit=4000)}", err=True)


@contextmanager
def one_line_errors(options: dict[str, Any] | None = None, *, exit_code: int = EXIT_ERROR,
                    broken_pipe_ok: bool = False, catch: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Expected failures -> one clean line (secrets scrubbed) and `exit_code`; Ctrl-C -> 130.

    `broken_pipe_ok`: a reader that went away (`shardflow ls ... | head`) ends the command quietly.
    `catch`: more exception types to report this way (beyond OSError, ValueError, KeyError, ImportError).
    """
    try:
        yield
    except BrokenPipeError as exc:
        if not broken_pipe_ok:
            raise Fail(_describe(exc, options), exit_code) from None
        _quiet_stdout()
        raise SystemExit(EXIT_OK) from None
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        click.echo("shardflow: interrupted", err=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except ShardflowError as exc:
        raise Fail(so.scrub(str(exc), options), exit_code) from None
    except (OSError, ValueError, KeyError, ImportError, *catch) as exc:
        raise Fail(_describe(exc, options), exit_code) from None


def _describe(exc: BaseException, options: dict[str, Any] | None) -> str:
    """`TypeName: message` of an unexpected exception, credentials scrubbed."""
    return so.scrub(f"{type(exc).__name__}: {str(exc) or type(exc).__name__}", options)


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def storage_option_flag(*, short: bool = True, help: str = STORAGE_OPTION_HELP) -> Callable[[Any], Any]:
    """The `--storage-option KEY=VALUE` option, `-S` for short: the one spelling of every command.

    `-o` means the output (`-o/--outputs`, `-o/--output`) in every command that writes one, never a
    storage option.
    """
    names = ("--storage-option", "-S") if short else ("--storage-option",)
    return click.option(*names, "storage_option", multiple=True, metavar="KEY=VALUE", help=help)


def parse_storage_options(items: tuple[str, ...]) -> dict[str, Any] | None:
    """`--storage-option` values as a storage_options dict (None when none were given)."""
    try:
        return so.parse_storage_options(items) or None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--storage-option") from None


_FIELD_TYPES = {"int": int, "float": float, "str": str}


def setting_option(name: str, *flags: str, **overrides: Any) -> Callable[[Any], Any]:
    """The click option of JobSpec setting `name`: `--name-with-dashes` (or `flags`), its help and default
    from the field (a False bool: a flag), its type from the annotation; `overrides` add to them (a
    narrower type, a metavar) or replace them (a command whose own default differs)."""
    default = setting_default(name)
    kwargs: dict[str, Any] = {"help": setting_help(name)}
    if default is False:
        kwargs["is_flag"] = True
    else:
        field = next(f for f in dataclasses.fields(JobSpec) if f.name == name)
        annotation = str(field.type).split("|")[0].strip()
        if annotation in _FIELD_TYPES:
            kwargs["type"] = _FIELD_TYPES[annotation]
        if default is not None:
            kwargs.update(default=default, show_default=True)
    kwargs.update(overrides)
    return click.option(*(flags or ("--" + name.replace("_", "-"),)), name, **kwargs)


def spec_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The shards a command reads: `SPEC...` arguments and/or `-i/--inputs SPEC` (repeatable), merged into
    the command's `spec` parameter in that order.

    `run`, `plan`, `k8s` take `-i/--inputs`; the tools that read shards took only positional SPECs, so
    `-i` there ended in click's "No such option". Both spellings work in every command now.
    """

    @functools.wraps(fn)
    def merged(*args: Any, spec: tuple[str, ...] = (), inputs_flag: tuple[str, ...] = (), **kw: Any) -> Any:
        specs = tuple(spec) + tuple(inputs_flag)
        if not specs:
            raise click.UsageError("give the shards to read: SPEC... or -i/--inputs SPEC")
        return fn(*args, spec=specs, **kw)

    merged = click.option("--inputs", "-i", "inputs_flag", multiple=True, metavar="SPEC",
                          help="shards to read, the same as the SPEC arguments (repeatable)")(merged)
    return click.argument("spec", nargs=-1, required=False)(merged)


def job_inputs_option(help: str = "input shards: brace pattern, glob, URL or dataset spec (repeatable)",
                      ) -> Callable[[Any], Any]:
    """`-i/--inputs SPEC` of the commands that load a job file, repeatable as in the shell tools.

    Given once it stays the string as written (so the plan fingerprint of a run started before `-i` was
    repeatable is unchanged and the run resumes); given several times the specs are joined in order, as
    the list form of a shard spec. A repeated `-i` used to keep only its last value, silently dropping
    the shards named before it. A dataset spec (train.yaml) names whole collections and cannot be joined
    with other specs: that is an error, not a guess.
    """

    def joined(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> str | list[str] | None:
        from shardflow.shards.spec import is_spec

        if not values:
            return None
        if len(values) == 1:
            return values[0]
        datasets = [v for v in values if is_spec(v)]
        if datasets:
            raise click.BadParameter(f"the dataset spec {safe(datasets[0])!r} cannot be joined with other "
                                     "-i specs: list every collection in the dataset spec instead", ctx, param)
        return list(values)

    return click.option("--inputs", "-i", metavar="SPEC", multiple=True, callback=joined, help=help)
