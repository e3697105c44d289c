"""storage/s3_listing: a folder's names from ListObjectsV2 pages without botocore's dict per key.

The page splitter is checked against botocore's own parser on generated pages (hypothesis: any key
text, XML-escaped, URL-encoded or not); `names_in` against s3fs's listing on a real SeaweedFS."""

from __future__ import annotations

import asyncio
from urllib.parse import quote
from xml.sax.saxutils import escape

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.storage.s3_listing import lean_entries, names_in

pytest.importorskip("botocore")

# XML 1.0 characters (no controls but tab/newline, no surrogates); \r is read back as \n by XML, so not
# a character a listing can carry literally (S3 sends it URL-encoded with encoding-type=url)
KEY_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufffe\uffff")
                   | st.sampled_from("\t\n<>&'\"%+ /"), min_size=1, max_size=40)


def page(keys: list[str], prefixes: list[str], *, url_encoded: bool, truncated: bool) -> bytes:
    """A ListObjectsV2 page as S3 writes it (full entries), keys escaped the way the page says."""
    def text(value: str) -> str:
        return escape(quote(value, safe="/") if url_encoded else value, {'"': "&quot;", "'": "&apos;"})

    contents = "".join(f"<Contents><Key>{text(k)}</Key><LastModified>2026-11-26T15:31:00.000Z</LastModified>"
                       f"<ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag><Size>0</Size><Owner><ID>o</ID>"
                       f"</Owner><StorageClass>STANDARD</StorageClass></Contents>" for k in keys)
    common = "".join(f"<CommonPrefixes><Prefix>{text(p)}</Prefix></CommonPrefixes>" for p in prefixes)
    more = "<NextContinuationToken>tok&amp;en</NextContinuationToken>" if truncated else ""
    encoding = "<EncodingType>url</EncodingType>" if url_encoded else ""
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
            f'2006-03-01/"><Name>b</Name><Prefix>{text("j/records/")}</Prefix><KeyCount>{len(keys)}</KeyCount>'
            f"<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>{encoding}<IsTruncated>{str(truncated).lower()}"
            f"</IsTruncated>{more}{contents}{common}</ListBucketResult>").encode()


def botocore_parse(body: bytes) -> dict:
    import botocore.session
    from botocore.parsers import RestXMLParser

    shape = botocore.session.get_session().get_service_model("s3").operation_model("ListObjectsV2").output_shape
    return RestXMLParser().parse({"body": body, "headers": {}, "status_code": 200}, shape)


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(KEY_TEXT, max_size=8), prefixes=st.lists(KEY_TEXT, max_size=3), url_encoded=st.booleans(),
       truncated=st.booleans())
def test_lean_entries_read_what_botocore_reads(keys, prefixes, url_encoded, truncated):
    body = page(keys, prefixes, url_encoded=url_encoded, truncated=truncated)
    full = botocore_parse(body)
    rest, contents, common = lean_entries(body)
    assert [c["Key"] for c in contents] == [c["Key"] for c in full.get("Contents", [])]
    assert [p["Prefix"] for p in common] == [p["Prefix"] for p in full.get("CommonPrefixes", [])]
    left = botocore_parse(rest)  # what botocore still parses: the page less its entries
    assert "Contents" not in left and "CommonPrefixes" not in left
    for field in ("IsTruncated", "NextContinuationToken", "EncodingType", "KeyCount", "Prefix", "Delimiter"):
        assert left.get(field) == full.get(field)


@given(st.binary(max_size=300))
def test_lean_entries_on_any_bytes_raise_at_most_value_error(body):
    try:
        rest, contents, common = lean_entries(body)
    except ValueError:
        return
    assert len(rest) <= len(body)


ODD_NAMES = ["a b.json", "x&y<z>.json", "pl+us%25.json", "üni.json", "q'\"t.json", "0001.json", "0002.json",
             ".hidden", "tab\there.json"]


@pytest.fixture
def odd_folder(s3_server, s3_bucket):
    fs = s3_server.filesystem()
    root = s3_bucket[len("s3://"):]
    fs.pipe({f"{root}/f/{name}": b"1" for name in [*ODD_NAMES, "sub/inner.json"]})
    return fs, f"{root}/f"


@pytest.mark.parametrize("page_size", [None, 2])
def test_names_in_lists_what_s3fs_lists(odd_folder, page_size):
    fs, folder = odd_folder
    from fsspec.asyn import sync

    files = sorted(e["name"].rsplit("/", 1)[1] for e in fs.ls(folder, detail=True) if e["type"] == "file")
    assert files == sorted(ODD_NAMES)
    assert sorted(sync(fs.loop, names_in, fs, folder, page_size=page_size)) == files  # 5 pages of 2 keys
    assert sync(fs.loop, names_in, fs, folder, "000") == ["0001.json", "0002.json"]
    assert sync(fs.loop, names_in, fs, f"{folder}/none") == []
    with pytest.raises(FileNotFoundError):
        sync(fs.loop, names_in, fs, "sf-no-such-bucket-x/f")


def test_other_listings_of_the_same_client_keep_full_entries(odd_folder):
    """The lean pages are scoped to names_in: s3fs's own listing, at the same time on the same client,
    still gets sizes and dates."""
    fs, folder = odd_folder
    from fsspec.asyn import sync

    async def both():
        return await asyncio.gather(names_in(fs, folder, page_size=2),
                                    fs._call_s3("list_objects_v2", Bucket=folder.split("/")[0], Prefix="f/",
                                                Delimiter="/", MaxKeys=2))

    names, full = sync(fs.loop, both)
    assert sorted(names) == sorted(ODD_NAMES)
    assert full["Contents"] and all("LastModified" in c and "Size" in c for c in full["Contents"])
    assert all("Size" in e for e in fs.ls(folder, detail=True, refresh=True))
