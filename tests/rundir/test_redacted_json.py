"""Every JSON file of the run directory is written with its URLs redacted (rundir.run_dir.redacted_json):
its shortcut (no redaction pass when the text holds no "://") must give exactly the bytes of the full
pass, whatever strings the data put in a record."""

from __future__ import annotations

import json
import types

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.rundir.run_dir import redacted_json
from shardflow.storage.options import redact_urls_deep

_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["s3://b/k.tar", "http://u:pw@host/x?sig=1", "a://", ":/"]),
                  st.builds(lambda a, b: a + "://" + b, st.text(max_size=6), st.text(max_size=8)))
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), _TEXT),
                     lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.booleans())
def test_the_shortcut_writes_what_the_full_redaction_writes(obj, compact):
    layout = {"separators": (",", ":")} if compact else {"indent": 1}
    assert redacted_json(obj, compact) == json.dumps(redact_urls_deep(obj), sort_keys=True, **layout)


def test_credentials_are_left_out_and_a_mapping_that_is_not_a_dict_is_written():
    record = {"inputs": ["http://alice:s3cretpw@host/a.tar"], "extra": types.MappingProxyType({"u": "s3://b/k"})}
    text = redacted_json(record, compact=True)
    assert "s3cretpw" not in text and "http://***@host/a.tar" in text
    assert json.loads(text)["extra"] == {"u": "s3://b/k"}
