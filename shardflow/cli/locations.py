"""`--mirror DIR` and `--rewrite PREFIX=REPLACEMENT`: where input shards are really read from
(storage/locate.py). They set the process's locations (and so the worker processes') as soon as
click parses them, so commands need no parameter for them."""

from __future__ import annotations

import os
from typing import Any, Callable

import click

from shardflow.storage.locate import ENV_REWRITE, LocateError, set_locations


def _set_mirror(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        set_locations(mirror=value)


def _set_rewrite(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    if value:
        try:
            earlier = os.environ.get(ENV_REWRITE)
            set_locations(rewrite=list(value) + ([earlier] if earlier else []))
        except LocateError as exc:
            raise click.BadParameter(str(exc), param_hint="--rewrite") from None


def location_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add --mirror and --rewrite to a command (inputs only; outputs are never rewritten)."""
    fn = click.option("--rewrite", multiple=True, metavar="PREFIX=REPLACEMENT", expose_value=False,
                      callback=_set_rewrite, help="read URLs starting with PREFIX from REPLACEMENT instead (a "
                      "PREFIX starting with ^ is a regex; repeatable; before $SHARDFLOW_REWRITE and the config)")(fn)
    return click.option("--mirror", metavar="DIR", expose_value=False, callback=_set_mirror,
                        help="local directory of downloaded shards (DIR/<bucket>/<path>) read instead of the "
                        "remote ones it holds")(fn)
