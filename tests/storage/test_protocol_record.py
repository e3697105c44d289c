"""A storage protocol added through its ONE record (storage.protocols) works end to end.

`sfrecord://` is fsspec's in-memory filesystem under a new protocol name and its own store. It is
registered twice, as a plugin would be: with fsspec (the filesystem) and with `register_protocol`
(how shardflow opens, publishes, lists and reads it). Every field of that one record is then seen at
work: shards are read through the source it names, written and published by the publisher it names,
globs list by key prefix, and a job reads from and writes to the protocol, its run directory there
too (small files read in one request). No other table is told about the protocol.
"""

from __future__ import annotations

from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shardflow.job.shard_job import ShardJob
from shardflow.shards.samples import read_samples
from shardflow.shards.writer import ShardWriter, TarWriter
from shardflow.storage.protocols import PROTOCOLS, Protocol, protocol_of, register_protocol
from shardflow.storage.publish import TempThenMove
from shardflow.storage.sources import ObjectSource
from shardflow.storage.specs import expand

PROTO = "sfrecord"
HERE = __name__  # the record names this module's classes as "module:attr", as plugins do


class RecordFS(MemoryFileSystem):
    """memory:// under another protocol name and store; it notes the prefixes listed and the
    keyword arguments of small-file reads, so the test sees which record fields reached it."""

    protocol = PROTO
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    prefixes: ClassVar[list[str]] = []
    cat_kwargs: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str):
            path = path.removeprefix(f"{PROTO}://")
        return super()._strip_protocol(path)

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        prefix = kwargs.pop("prefix", None)
        found = super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        if prefix is None:
            return found
        type(self).prefixes.append(prefix)  # listed server-side by prefix, as s3fs / gcsfs do
        return [name for name in found if name.rsplit("/", 1)[-1].startswith(prefix)]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if start is None and end is None:
            type(self).cat_kwargs.append(dict(kwargs))
        return super().cat_file(path, start=start, end=end)


class CountingPublish(TempThenMove):
    """The record's publisher: TempThenMove (memory files publish on close, so no streaming upload),
    counting its commits so the test knows open_atomic took it from the record."""

    commits: ClassVar[list[str]] = []

    def _publish(self) -> None:
        super()._publish()
        type(self).commits.append(self.url)


class CountingSource(ObjectSource):
    """The record's source for ranged, version-pinned reads: the generic one, counted."""

    opened: ClassVar[list[str]] = []

    def __init__(self, fs: Any, path: str, url: str) -> None:
        super().__init__(fs, path, url)
        type(self).opened.append(url)


RECORD = Protocol(
    PROTO,
    read="shardflow.storage.openers:read_ranged",
    write="shardflow.storage.openers:write_upload",
    publisher=f"{HERE}:CountingPublish",
    listing_by_prefix=True,
    source=f"{HERE}:CountingSource",
    source_needs="store",
    cat_in_one_request=True,
)


@pytest.fixture
def sfrecord():
    """The protocol registered with fsspec and with shardflow's one record; all traces reset."""
    fsspec.register_implementation(PROTO, RecordFS, clobber=True)
    register_protocol(RECORD)
    for trace in (RecordFS.store, RecordFS.prefixes, RecordFS.cat_kwargs, CountingPublish.commits,
                  CountingSource.opened):
        trace.clear()
    RecordFS.pseudo_dirs[:] = [""]
    try:
        yield fsspec.filesystem(PROTO)
    finally:
        PROTOCOLS.pop(PROTO, None)
        RecordFS.store.clear()


def _samples(n: int, prefix: str = "s") -> list[dict[str, Any]]:
    return [{"__key__": f"{prefix}{i:04d}", "txt": f"sample {i}".encode(), "cls": b"%d" % (i % 3)}
            for i in range(n)]


def _read(url: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "__url__"} for s in read_samples(url)]


def add_tag(sample: dict[str, Any]) -> dict[str, Any]:
    """The job's function: one member added, so the outputs are the job's and not copies."""
    return {"__key__": sample["__key__"], "txt": sample["txt"], "tag": b"seen"}


def test_the_record_is_what_a_lookup_returns(sfrecord):
    assert protocol_of(f"{PROTO}://bucket/x.tar") is RECORD
    with pytest.raises(ValueError, match="already has a record"):
        register_protocol(Protocol(PROTO))  # a second plugin claiming the name fails loudly
    assert protocol_of("nosuchproto://b/k").name == "*"  # unknown protocols get the default record


def test_write_publish_read_and_list_through_the_one_record(sfrecord):
    samples = _samples(10)
    final = f"{PROTO}://bucket/one.tar"
    with TarWriter(final) as writer:
        for sample in samples[:4]:
            writer.write(sample)
        assert not sfrecord.exists(final)  # nothing under the final name before the commit
    assert sfrecord.exists(final) and CountingPublish.commits == [final]

    with pytest.raises(RuntimeError, match="stop"), TarWriter(f"{PROTO}://bucket/aborted.tar") as writer:
        writer.write(samples[0])
        raise RuntimeError("stop")
    assert sorted(sfrecord.ls("/bucket", detail=False)) == ["/bucket/one.tar"]  # no final, no temp left

    with ShardWriter(f"{PROTO}://bucket/part-%06d.tar", maxcount=4) as writer:
        for sample in samples:
            writer.write(sample)
    parts = expand(f"{PROTO}://bucket/part-*.tar")
    assert RecordFS.prefixes == ["part-"]  # listed by key prefix, not the whole folder
    assert [p.rsplit("/", 1)[-1] for p in parts] == ["part-000000.tar", "part-000001.tar", "part-000002.tar"]

    assert _read(final) == samples[:4]
    assert [s for p in parts for s in _read(p)] == samples
    assert final in CountingSource.opened  # read ranged through the source the record names


def test_a_job_from_and_to_the_protocol(sfrecord):
    samples = _samples(12)
    with ShardWriter(f"{PROTO}://data/in-%06d.tar", maxcount=5) as writer:
        for sample in samples:
            writer.write(sample)
    CountingPublish.commits.clear()

    job = ShardJob(add_tag, f"{PROTO}://data/in-*.tar", f"{PROTO}://data/out/{{name}}.tar")
    job.run("serial", progress=False)

    outputs = expand(f"{PROTO}://data/out/in-*.tar")
    assert [o.rsplit("/", 1)[-1] for o in outputs] == ["in-000000.tar", "in-000001.tar", "in-000002.tar"]
    assert [s for o in outputs for s in _read(o)] == [add_tag(s) for s in samples]
    published = sorted(url.rsplit("/", 1)[-1] for url in CountingPublish.commits)
    assert published == ["in-000000.tar", "in-000001.tar", "in-000002.tar"]  # by the record's publisher
    assert job.run_dir.startswith(f"{PROTO}://")  # the run directory lives there too ...
    assert {"max_concurrency": 1} in RecordFS.cat_kwargs  # ... its small files read in one request
