"""Property tests of the file names `map` makes of keys (issue 26 item 10): any key gives one short, safe
file name component, and keys cut short stay apart."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardflow.job.shell_files import MAX_STEM, file_base, member_file_name

KEYS = st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=400)


@given(key=KEYS, ext=st.sampled_from(["txt", "jpg", "seg.png", "json.gz", "数据"]))
def test_any_key_gives_one_short_safe_file_name(key, ext):
    name = member_file_name(key, ext)
    assert len(name.encode()) <= 255 and "/" not in name and name.isascii() and name.isprintable()
    assert not name.startswith(("-", ".")) and name.partition(".")[2]
    assert len(file_base(key)) <= MAX_STEM


@given(a=KEYS, b=KEYS)
def test_long_stems_of_different_keys_differ(a, b):
    if a != b and "~" in file_base(a) and "~" in file_base(b):  # both cut: the hash of the key tells them apart
        assert file_base(a) != file_base(b)
