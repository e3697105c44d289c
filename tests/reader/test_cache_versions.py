"""The reader's shard cache serves a copy only of the version the remote has now.

Remote shards are stood in for by local files behind a rewrite rule (`s3://versions/=DIR/`): the
dataset names S3 URLs, so it reads through the cache, and the bytes come from files this test can
rewrite, delete and time-stamp. tests/reader/test_s3_cache_versions.py does the same on a real S3 server.
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("torch")

from shardflow import ShardDataset  # noqa: E402
from shardflow.errors import ShardIOError  # noqa: E402
from shardflow.reader import warn_once  # noqa: E402
from shardflow.reader.cache import ShardCache  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402
from shardflow.storage.sources import object_version  # noqa: E402

URL = "s3://versions/train/s-{000..001}.tar"


def write_shard(directory, index: int, keys: list[str]) -> str:
    """Shard `s-<index>.tar` in `directory` holding `keys` (same-length keys: same-size shards)."""
    with ShardWriter(os.path.join(directory, "s-%03d.tar"), start_index=index, maxcount=10**6) as w:
        for key in keys:
            w.write({"__key__": key, "cls": key[-3:].encode()})
    return w.shards[0].url


def rewrite(directory, index: int, keys: list[str]) -> None:
    """Replace a shard with other samples, its mtime clearly later (a coarse-clock filesystem would
    otherwise give a same-size rewrite within one tick the old identity: undetectable by design)."""
    path = os.path.join(directory, f"s-{index:03d}.tar")
    before = os.stat(path)
    write_shard(directory, index, keys)
    assert os.stat(path).st_size == before.st_size  # a rewrite only the identity's mtime tells apart
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))


def keys(ds) -> list[str]:
    return [s["__key__"] for s in ds]


@pytest.fixture
def remote(tmp_path):
    """A folder standing in for s3://versions/train/, two shards of 4 samples, and a dataset over them."""
    folder = tmp_path / "remote"
    folder.mkdir()
    write_shard(folder, 0, [f"a{i:03d}" for i in range(4)])
    write_shard(folder, 1, [f"b{i:03d}" for i in range(4)])
    cache = tmp_path / "cache"

    def dataset() -> ShardDataset:
        return ShardDataset(URL, rewrite=[f"s3://versions/train/={folder}/"], manifest=False, decode=None,
                            cache_dir=str(cache))

    return folder, cache, dataset


def entries(cache) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


def test_a_rewritten_shard_is_read_again_not_served_stale(remote):
    folder, cache, dataset = remote
    ds = dataset()
    assert keys(ds) == [f"a{i:03d}" for i in range(4)] + [f"b{i:03d}" for i in range(4)]
    first = {name: os.stat(cache / name).st_ino for name in entries(cache)}
    assert len(first) == 2
    assert keys(ds)[:4] == [f"a{i:03d}" for i in range(4)]  # unchanged: served by the same entries
    assert {name: os.stat(cache / name).st_ino for name in entries(cache)} == first

    rewrite(folder, 0, [f"c{i:03d}" for i in range(4)])
    assert keys(ds)[:4] == [f"c{i:03d}" for i in range(4)]  # the new samples, not the cached old ones
    assert keys(dataset())[:4] == [f"c{i:03d}" for i in range(4)]  # and from the new entry
    now = entries(cache)
    assert len(now) == 2 and not any(".tmp-" in name for name in now)  # the old version's entry is gone
    assert set(now) - set(first) and set(now) & set(first)  # shard 0's entry replaced, shard 1's kept


def test_an_unreachable_store_serves_the_cached_copy_with_one_warning(remote):
    folder, cache, dataset = remote
    ds = dataset()
    old = keys(ds)
    os.unlink(folder / "s-000.tar")  # the store cannot say the version any more
    warn_once.warned.clear()
    with pytest.warns(UserWarning, match=r"s3://versions/train/s-000\.tar: its store could not be asked"):
        assert keys(ds) == old
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keys(ds) == old  # said once per process, not every epoch
    for name in entries(cache):
        os.unlink(cache / name)
    with pytest.raises(ShardIOError, match="s-000.tar"):  # no copy: the shard's own error
        keys(ds)


def test_entries_of_older_versions_are_a_miss(remote, tmp_path):
    folder, cache, dataset = remote
    url = "s3://versions/train/s-000.tar"
    cache.mkdir()
    unversioned = cache / f"{ShardCache(str(cache))._url_hash(url)}-s-000.tar"  # the name before identities
    stale = folder / "stale.tar"
    write_shard(folder, 9, [f"z{i:03d}" for i in range(4)])
    os.replace(folder / "s-009.tar", stale)
    os.replace(stale, unversioned)  # an old copy of other samples, under the old name
    assert keys(dataset())[:4] == [f"a{i:03d}" for i in range(4)]
    assert not unversioned.exists() and len(entries(cache)) == 2


def test_two_readers_of_one_shard_see_whole_files_while_it_is_replaced(tmp_path):
    """Reader X holds the old entry open; reader Y finds a new version and replaces the entry: X still
    reads every old byte, and the cache ends with one whole entry of the new version."""
    src = tmp_path / "object.bin"
    src.write_bytes(b"old-" * 50_000)
    cache = ShardCache(str(tmp_path / "cache"))
    url = "s3://b/object.bin"

    def open_copy():
        return cache.open(url, lambda: open(src, "rb"), version=lambda: object_version(str(src)))

    first = open_copy()
    assert first.read() == b"old-" * 50_000
    first.finish()
    x = open_copy()  # a hit
    assert x.read(10) == b"old-old-ol"
    st = os.stat(src)
    src.write_bytes(b"new-" * 50_000)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    y = open_copy()  # a miss: the new version, teed into a temp and renamed in
    assert y.read() == b"new-" * 50_000
    y.finish()
    assert x.read() == (b"old-" * 50_000)[10:]
    x.close()
    (entry,) = os.listdir(cache.directory)
    assert (tmp_path / "cache" / entry).read_bytes() == b"new-" * 50_000


def test_a_failing_store_is_not_asked_again_for_a_while_a_missing_object_is(tmp_path):
    """After the store itself fails a check (a broken mount here: NotADirectoryError), its cached copies
    are used unchecked for a while (an outage costs one client timeout, not one per shard open); a
    missing object (FileNotFoundError) is only that object's problem: the next open asks again."""
    src = tmp_path / "object.bin"
    src.write_bytes(b"v1" * 1000)  # the remote object, standing in for a store
    cache = ShardCache(str(tmp_path / "cache"))
    calls: list[str] = []
    data = b"v1" * 1000

    def remote():
        return open(src, "rb")

    def cached(url, store_path):
        with cache.open(url, remote, version=version_of(store_path)) as f:
            return f.read()

    def version_of(path):
        def version():
            calls.append(str(path))
            return object_version(str(path))
        return version

    for url in ("s3://b/object.bin", "s3://other/object.bin"):
        f = cache.open(url, remote, version=version_of(src))
        f.read()
        f.finish()
    calls.clear()
    broken = tmp_path / "mount"
    broken.write_bytes(b"")  # a file where the store's folder should be
    warn_once.warned.clear()
    with pytest.warns(UserWarning, match=r"s3://b/object\.bin: .*NotADirectoryError"):
        assert cached("s3://b/object.bin", broken / "object.bin") == data
    assert cached("s3://b/object.bin", broken / "object.bin") == data
    assert len(calls) == 1  # the second open did not wait on the failed store again

    missing = tmp_path / "deleted.bin"
    with pytest.warns(UserWarning, match="FileNotFoundError"):
        assert cached("s3://other/object.bin", missing) == data
    assert cached("s3://other/object.bin", missing) == data
    assert len(calls) == 3  # asked each time


def test_a_shard_read_into_the_cache_tells_its_size_for_the_manifest_check(tmp_path):
    """reader.manifest_check compares a shard's size with its manifest as it is opened: a shard being
    copied into the cache says the remote object's size too (it said nothing: a stale manifest of a
    cached remote shard went unnoticed)."""
    import fsspec

    from shardflow.reader.cache import _Tee
    from shardflow.reader.manifest_check import stream_size

    shard = write_shard(str(tmp_path), 0, [f"a{i:03d}" for i in range(4)])
    cache = ShardCache(str(tmp_path / "cache"))
    with fsspec.open(shard, "rb").open() as remote:
        tee = _Tee(remote, cache, str(tmp_path / "cache" / "copy.tar"), None, None)
        try:
            assert stream_size(tee) == os.path.getsize(shard)
        finally:
            tee.close()
