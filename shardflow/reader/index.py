"""Indexing shards shardflow did not write: sample counts, sizes and sha256, as the manifest a job writes.

A job leaves `_shardflow/summary.json` beside its outputs; the reader takes sample counts from it
(manifest.py) to split an epoch by samples (equal counts per rank, len(), equalize=). Shards made
elsewhere (plain tar, webdataset's writer, a download) have none, and with several ranks each rank then
reads a different number of samples: a collective at the end of the epoch waits forever. `shardflow
index SPEC` reads every shard once (each sample counted as the reader counts it, every byte hashed)
and writes the same summary.json (`{"shards": [{"url", "nsamples", "nbytes", "sha256"}, ...]}`) where
the reader looks: beside the first shard of the spec (of each collection, for a dataset spec), or at
`output`. Entries already there for other shards are kept.

Resumable: each shard's entry is appended to a local checkpoint (`$SHARDFLOW_INDEX_STATE`, else
~/.cache/shardflow/index/<hash of the manifest's absolute URL>.jsonl) as soon as it is known; a rerun
skips the shards listed there that have not changed since (size and modification time, or the store's
ETag: a shard replaced in between is counted again), so a 100k-shard index killed half way costs the
other half only (and a stat or HEAD per shard done before). The manifest is
written once, atomically (local rename, or an upload published on close), when every shard of it is
indexed; then the checkpoint is removed. A shard that fails (damaged, unreadable) is reported with its
URL and reason and leaves the manifest unwritten (a partial manifest is never used by the reader); the
rerun retries only the failed shards. Samples are counted by the reader's own reading (read_samples):
members of no sample are left out as the reader leaves them out, and `on_error="skip"` counts what a
reader that skips bad samples delivers (a bad sample in the data fails the shard under raise; a rerun
cannot help it).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator

from shardflow.errors import DEFAULT_ON_ERROR_READ, ShardflowError, ShardIOError, check_on_error
from shardflow.reader.manifest import load_manifest, summary_url
from shardflow.rundir.layout import PLAN
from shardflow.shards.samples import read_samples
from shardflow.shards.spec import is_spec, load_spec
from shardflow.storage.atomic import write_local_atomic
from shardflow.storage.options import options_for
from shardflow.storage.paths import is_local, local_path
from shardflow.storage.schemes import open_read, open_write
from shardflow.storage.sources import object_version
from shardflow.storage.specs import expand

STATE_ENV = "SHARDFLOW_INDEX_STATE"
_VERSION = "version"  # of a checkpoint entry: shard_version() when it was read (not in the manifest)
_CHUNK = 1 << 20


@dataclass
class Target:
    """One manifest to write and the shards it lists (in spec order)."""

    manifest: str
    urls: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """What an index run did: manifests written, shards indexed now and before, failures (url, reason)."""

    written: list[str] = field(default_factory=list)
    counted_by_job: list[str] = field(default_factory=list)  # job summaries that already count their shards
    indexed: int = 0
    resumed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    bad_data: list[str] = field(default_factory=list)  # of `failed`: the cause is in the shard, a rerun fails too
    left_out: list[tuple[str, int, str]] = field(default_factory=list)  # (url, how many, the first reason)


def targets(specs: list[str] | tuple[str, ...], storage_options: Any = None, output: str | None = None) -> list[Target]:
    """The manifests to write for `specs`: one at `output`, else one beside the first shard of each
    shard spec and of each collection of a dataset spec (collections in one folder share it)."""
    groups: list[list[str]] = []
    for spec in specs:
        if is_spec(spec):
            groups.extend(list(c.urls) for c in load_spec(spec, storage_options).collections)
        else:
            groups.append(expand(spec, options_for(spec, storage_options)))
    if output is not None:
        return [Target(output if output.endswith(".json") else output.rstrip("/") + "/summary.json",
                       _unique(u for g in groups for u in g))]
    by_manifest: dict[str, dict[str, None]] = {}  # manifest -> its shards (ordered, once each)
    for urls in groups:
        by_manifest.setdefault(summary_url(urls[0]), {}).update(dict.fromkeys(urls))
    return [Target(manifest, list(urls)) for manifest, urls in by_manifest.items()]


def _unique(urls: Any) -> list[str]:
    return list(dict.fromkeys(urls))


class _Hashing:
    """A read-only stream that hashes and counts every byte its reader pulls."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.sha, self.nbytes = stream, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.sha.update(data)
        self.nbytes += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True


def index_shard(url: str, storage_options: Any = None, *, on_error: str = DEFAULT_ON_ERROR_READ,
                report: Callable[[ShardflowError], None] | None = None) -> dict[str, Any]:
    """The manifest entry of one shard: samples as the reader counts them (read_samples, the reader's own
    rule: a member of no sample is left out, and under `on_error="skip"` every bad sample the reader
    leaves out is left out of the count and given to `report`; under raise the first one is raised), its
    size and sha256 over all its bytes (what a job's receipt records)."""
    stream = open_read(url, options_for(url, storage_options))
    try:
        hashing = _Hashing(stream)
        nsamples = sum(1 for _ in read_samples(hashing, url, on_error=on_error, report=report))  # type: ignore[arg-type]
        while hashing.read(_CHUNK):  # the rest (end-of-archive blocks, padding): the hash covers the file
            pass
    finally:
        stream.close()
    return {"url": url, "nsamples": nsamples, "nbytes": hashing.nbytes, "sha256": hashing.sha.hexdigest()}


def shard_version(url: str, storage_options: Any = None) -> str:
    """What says a shard is still the one a checkpoint entry counted: size and mtime of a local file, the
    store's size, ETag / generation / modification time of an object ('' when it cannot be looked at:
    then the shard is indexed again). Taken before the shard is read, so a shard replaced while it was
    read differs at the next resume."""
    try:
        return json.dumps(object_version(url, storage_options))  # the reader's rule of what a version is
    except Exception:  # noqa: BLE001 - unknown: the checkpoint entry is not trusted
        return ""


_Indexed = tuple[str, "dict[str, Any] | None", "str | None", bool, "list[str]"]  # see _index_one


def _index_one(job: tuple[str, Any, str]) -> _Indexed:
    """(url, entry or None, the error, whether the error is in the data (not I/O: a rerun fails the same
    way), the reasons of what the reading left out)."""
    url, options, on_error = job
    left_out: list[str] = []
    try:
        version = shard_version(url, options)
        entry = index_shard(url, options, on_error=on_error, report=lambda e: left_out.append(str(e)))
        return url, {**entry, _VERSION: version}, None, False, left_out
    except ShardIOError as exc:
        return url, None, str(exc), False, left_out
    except ShardflowError as exc:  # a damaged archive, a bad sample: the cause is in the shard
        return url, None, str(exc), True, left_out
    except (OSError, ValueError, EOFError) as exc:
        return url, None, str(ShardIOError(f"{type(exc).__name__}: {exc}", url=url)), False, left_out


def state_path(manifest: str) -> str:
    """The local checkpoint of the index of `manifest`: named by the manifest's absolute path (two
    folders' `-o idx.json` are two checkpoints, not one)."""
    folder = os.environ.get(STATE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shardflow", "index")
    where = os.path.abspath(local_path(manifest)) if is_local(manifest) else manifest
    return os.path.join(folder, hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".jsonl")


def _load_state(path: str) -> dict[str, dict[str, Any]]:
    """Entries of the checkpoint (a line cut by a kill is ignored: that shard is indexed again)."""
    done: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                    done[entry["url"]] = entry
    except FileNotFoundError:
        pass
    return done


def run_index(plan: list[Target], storage_options: Any = None, *, processes: int = 1,
              progress: Callable[[int, int], None] | None = None, on_error: str = DEFAULT_ON_ERROR_READ) -> Outcome:
    """Index every shard of `plan` (resuming from the checkpoints), then write each manifest whose
    shards all succeeded. `progress(done, total)` is called as shards finish. `on_error` is the
    reader's (index_shard): "skip" counts what a reader that skips bad samples delivers."""
    check_on_error(on_error)
    outcome = Outcome()
    total = sum(len(t.urls) for t in plan)
    finished = 0
    for target in plan:
        if _counted_by_its_job(target, storage_options):
            outcome.counted_by_job.append(target.manifest)
            finished += len(target.urls)
            continue
        path = state_path(target.manifest)
        wanted = set(target.urls)
        done = {u: e for u, e in _load_state(path).items()
                if u in wanted and e.get(_VERSION) and e[_VERSION] == shard_version(u, storage_options)}
        outcome.resumed += len(done)
        finished += len(done)
        todo = [u for u in target.urls if u not in done]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        failed_before = len(outcome.failed)
        with open(path, "a", encoding="utf-8") as state:
            for url, entry, error, in_data, left_out in _map(todo, storage_options, processes, on_error):
                finished += 1
                if left_out:
                    outcome.left_out.append((url, len(left_out), left_out[0]))
                if entry is None:
                    outcome.failed.append((url, error or "failed"))
                    if in_data:
                        outcome.bad_data.append(url)
                else:
                    done[url] = entry
                    outcome.indexed += 1
                    state.write(json.dumps(entry) + "\n")
                    state.flush()
                if progress is not None:
                    progress(finished, total)
        if len(outcome.failed) == failed_before:
            entries = [{k: v for k, v in done[u].items() if k != _VERSION} for u in target.urls]
            write_manifest(target.manifest, entries, storage_options)
            outcome.written.append(target.manifest)
            os.remove(path)
    return outcome


def _counted_by_its_job(target: Target, storage_options: Any) -> bool:
    """Whether `target.manifest` is the summary.json of a job's run directory (a plan.json beside it) that
    already counts every shard of the target: then there is nothing to index, and nothing is written.

    A job owns its summary (its status, report and resumes read it): index used to replace the job's
    entries with its own, under other spellings of the same URLs. A job summary that misses some of these
    shards is refused, not amended: the job's next finalize would rewrite it anyway.
    """
    run_dir = target.manifest.rsplit("/", 1)[0] if "/" in target.manifest else "."
    plan = f"{run_dir}/{PLAN}"
    try:
        with open_read(plan, options_for(plan, storage_options)):
            pass
    except ShardflowError:
        return False  # no plan.json (or unreadable): not a job's run directory
    try:
        load_manifest(target.manifest, target.urls, storage_options)  # explicit: raises unless it lists all
    except ValueError as exc:
        raise ShardflowError(f"{exc}; it is the summary of the job run in {run_dir}, which index does not "
                             "rewrite: index these shards into a manifest of their own with -o FILE.json "
                             "(and give it to the reader as manifest=)") from exc
    return True


def _map(urls: list[str], storage_options: Any, processes: int, on_error: str) -> Iterator[_Indexed]:
    jobs = [(u, storage_options, on_error) for u in urls]
    if processes <= 1 or len(jobs) < 2:
        yield from map(_index_one, jobs)
        return
    context = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                          else "spawn")
    with context.Pool(min(processes, len(jobs))) as pool:
        yield from pool.imap_unordered(_index_one, jobs, chunksize=4)


def write_manifest(manifest: str, entries: list[dict[str, Any]], storage_options: Any = None) -> None:
    """Write `entries` as the `shards` of the summary.json at `manifest`, keeping what it already lists
    for other shards (and its other fields); atomically."""
    data: dict[str, Any] = {}
    try:
        with open_read(manifest, options_for(manifest, storage_options)) as f:
            old = json.loads(f.read())
        data = old if isinstance(old, dict) else {"shards": old}
    except (ShardflowError, OSError, ValueError):
        pass
    ours = {e["url"] for e in entries}
    kept = [e for e in data.get("shards") or [] if isinstance(e, dict) and e.get("url") not in ours]
    data["shards"] = kept + entries
    text = json.dumps(data, indent=1).encode()
    if is_local(manifest):
        write_local_atomic(local_path(manifest), text)
        return
    with open_write(manifest, options_for(manifest, storage_options)) as f:  # published on close
        f.write(text)
