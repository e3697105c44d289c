"""CPU to read one 1,000-key ListObjectsV2 page (a run directory's records/ page): botocore's parser as s3fs
uses it, the same without timestamp parsing, and storage/s3_listing's split plus botocore on what is left.

    .venv/bin/python bench/bench_listing.py [--keys 1000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardflow.storage.s3_listing import lean_entries  # noqa: E402


def page(keys: int) -> bytes:
    """A page as S3 writes it: full entries of records/ names (run_task's shape)."""
    items = "".join(f"<Contents><Key>j/_shardflow/records/{i:06d}.d.1.1795700000.120.80.1.1.w3</Key>"
                    "<LastModified>2026-11-26T15:31:00.000Z</LastModified><ETag>&quot;d41d8cd98f00b204e9800998ecf8427e"
                    "&quot;</ETag><Size>0</Size><Owner><ID>x</ID></Owner><StorageClass>STANDARD</StorageClass>"
                    "</Contents>" for i in range(keys))
    return ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>b</Name><Prefix>j/_shardflow/records/</Prefix><KeyCount>{keys}</KeyCount><MaxKeys>1000</MaxKeys>"
            "<Delimiter>/</Delimiter><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
            f"<NextContinuationToken>abc</NextContinuationToken>{items}</ListBucketResult>").encode()


def cpu_ms(fn, rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / rounds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    import botocore.session
    from botocore.parsers import RestXMLParser

    shape = botocore.session.get_session().get_service_model("s3").operation_model("ListObjectsV2").output_shape
    body = page(args.keys)

    def response(data: bytes) -> dict:
        return {"body": data, "headers": {}, "status_code": 200}

    rest = lean_entries(body)[0]
    rows = {
        "botocore (as s3fs parses it)": cpu_ms(lambda: RestXMLParser().parse(response(body), shape), args.rounds),
        "botocore, timestamps left as text": cpu_ms(
            lambda: RestXMLParser(timestamp_parser=lambda x: x).parse(response(body), shape), args.rounds),
        "s3_listing.lean_entries": cpu_ms(lambda: lean_entries(body), args.rounds),
        "botocore on what lean_entries leaves": cpu_ms(lambda: RestXMLParser().parse(response(rest), shape),
                                                       args.rounds),
    }
    for label, ms in rows.items():
        print(f"{label:40s} {ms:7.2f} ms CPU per {args.keys}-key page")


if __name__ == "__main__":
    main()
