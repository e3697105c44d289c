"""Property tests of the spec parsers (issue 26): whatever a spec holds, loading it gives a DatasetSpec
or one SpecError, never another exception; brace groups are counted exactly as braceexpand expands."""

from __future__ import annotations

import braceexpand
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardflow.errors import ShardIOError
from shardflow.shards.spec import SpecError, load_spec
from shardflow.storage.specs import brace_count, expand

# shard-spec text without glob characters (a glob would list the file system) or `${`
_SPEC_TEXT = st.text(alphabet="ab01{},.-/\\", max_size=24)
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**25, 10**25),
                  st.floats(allow_nan=True, allow_infinity=True), _SPEC_TEXT)
_KEYS = st.sampled_from(["dataset", "datasets", "epoch", "shards", "spec", "weight", "repeat", "scale",
                         "scaleprob", "extensions", "rename", "fields", "name", "prefix", "buckets",
                         "resample", "wieght", "x"])
_DATA = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(_KEYS, inner, max_size=5)), max_leaves=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.text(alphabet="ab1{},.\\", max_size=16))
def test_brace_count_matches_braceexpand(pattern):
    counted = brace_count(pattern)  # never raises below MAX_NESTING levels
    try:
        expanded = list(braceexpand.braceexpand(pattern))
    except braceexpand.UnbalancedBracesError:
        with pytest.raises(ShardIOError, match="unbalanced braces"):
            expand(pattern)
        return
    assert counted >= len(expanded)  # an upper bound, so the MAX_URLS refusal is never too late
    if "{}" not in pattern and "\\" not in pattern and "}{" not in pattern and _balanced(pattern):
        assert counted == len(expanded)


def _balanced(pattern: str) -> bool:
    """No `}` before its `{` and none left open: braceexpand reads some unbalanced patterns as literal
    text (`}1{,` is one name), which brace_count counts as an upper bound (its docstring)."""
    depth = 0
    for ch in pattern:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            return False
    return depth == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_DATA)
def test_any_structure_loads_or_is_one_spec_error(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spec")
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(data))
    for spec in (str(path), data if isinstance(data, dict) else {"dataset": data}):
        try:
            loaded = load_spec(spec)
        except SpecError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 3000
        else:
            assert loaded.collections


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet="-[]{}:&*! ab,.\n'\"#|>", max_size=120))
def test_any_text_loads_or_is_one_spec_error(text, tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "train.yaml"
    path.write_text(text)
    try:
        load_spec(str(path))
    except SpecError as exc:
        assert "\n" not in str(exc)
