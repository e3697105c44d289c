"""Click types for numeric options that must be finite: sizes, memory, timeouts.

click.FloatRange lets `nan` and `inf` through (every comparison with nan is false, and inf is within
an open-ended range), so `--memory nan` reached int() as a traceback and `--timeout nan` made every
sample time out as "a bug in the job". These types refuse them at the option, the way click refuses
`abc`: a usage error naming the option, exit 2.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A float within [min, max] (either end optional; `min_open`: strictly above min) that is finite."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def finite(minimum: float | None = None, *, above: bool = False) -> FiniteFloat:
    """A finite float option type, at least `minimum` (`above`: strictly more than it)."""
    return FiniteFloat(min=minimum, min_open=above)
