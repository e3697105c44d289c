"""Loader's persistent workers: epochs run by kept workers are exactly the epochs fresh workers
run (order, resume, set_epoch jumps, epochs left early), and batches held from an earlier epoch stay
intact while later epochs reuse the shared-memory buffers."""

from __future__ import annotations

import gc
import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardflow import Loader, ShardDataset  # noqa: E402
from shardflow.reader.shm import RingConfig  # noqa: E402
from shardflow.shards.writer import ShardWriter  # noqa: E402


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("persistent")
    with ShardWriter(os.path.join(d, "q-%03d.tar"), maxcount=9) as w:
        for i in range(45):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), i * 5, np.uint8)).save(buf, "JPEG", quality=95)
            w.write({"__key__": f"k{i:03d}", "jpg": buf.getvalue(), "cls": str(i).encode()})
    return sorted(str(p) for p in d.glob("q-*.tar"))


def dataset(urls, **kw):
    return ShardDataset(urls, decode="torchrgb8", batch_size=4, shuffle=10, seed=5, manifest=False, **kw)


def keys(batches):
    return [k for b in batches for k in b["__key__"]]


def epoch_keys(urls, epoch):
    loader = Loader(dataset(urls), num_workers=2, persistent_workers=False)
    loader.set_epoch(epoch)
    return keys(loader)


@pytest.mark.slow
def test_kept_workers_run_the_same_epochs_as_fresh_ones(urls):
    loader = Loader(dataset(urls), num_workers=2)
    first = keys(loader)
    kept = loader._workers
    second = keys(loader)
    assert kept is not None and loader._workers is kept  # the same workers ran both epochs
    assert first == epoch_keys(urls, 0) and second == epoch_keys(urls, 1)
    loader.set_epoch(5)  # a jump: fresh workers
    assert keys(loader) == epoch_keys(urls, 5) and loader._workers is not kept
    b = next(iter(loader))  # epoch 6, left early: the workers stop at once
    assert loader._workers is None
    state = loader.state_dict()
    resumed = Loader(dataset(urls), num_workers=2)
    resumed.load_state_dict(state)
    assert sorted(b["__key__"] + keys(resumed)) == sorted(epoch_keys(urls, 6))
    assert keys(resumed) == epoch_keys(urls, 7)
    assert keys(loader) == epoch_keys(urls, 6)  # iterated again: epoch 6 from its start
    assert keys(loader) == epoch_keys(urls, 7)


def test_changed_options_start_fresh_workers(urls):
    ds = dataset(urls)
    loader = Loader(ds, num_workers=2)
    keys(loader)
    kept = loader._workers
    ds.shuffle = 0
    fresh = Loader(dataset(urls), num_workers=2, persistent_workers=False)
    fresh.dataset.shuffle = 0
    fresh.set_epoch(1)
    assert keys(loader) == keys(fresh) and loader._workers is not kept


@pytest.mark.parametrize("channels_last", [False, True])
def test_batches_held_across_epochs_stay_intact(urls, channels_last):
    ref = {k: img for b in dataset(urls) for k, img in zip(b["__key__"], b["jpg"])}
    loader = Loader(dataset(urls, channels_last=channels_last), num_workers=2, prefetch_factor=1)
    held = []
    for _ in range(4):
        for i, b in enumerate(loader):
            if i % 3 == 0:
                held.append((b["__key__"], b["jpg"]))
            assert all(torch.equal(img, ref[k]) for k, img in zip(b["__key__"], b["jpg"]))
    assert loader._workers is not None and len(held) > 12
    for ks, images in held:
        for k, img in zip(ks, images):
            assert torch.equal(img, ref[k]), k


def _descriptors(pid: int) -> tuple[int, int]:
    """(torch's shared-memory segments: ring slots, other descriptors) open in a process."""
    shm = other = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed while listed
            continue
        shm, other = (shm + 1, other) if target.startswith("/dev/shm/torch_") else (shm, other + 1)
    return shm, other


def test_kept_workers_hold_memory_and_files_steady(urls):
    """Other descriptors stay as they were; shared-memory segments may still appear as a worker first
    needs another ring slot (epoch 13 of 30 in one run), but never more than the rings hold.

    Processes are told apart by pid (earlier tests of the session leave children of their own, a
    forkserver, whose place in `children()` may change), and counted after a garbage collection: what a
    reference cycle still holds is not this loader's."""
    psutil = pytest.importorskip("psutil")
    me, seen = psutil.Process(), []
    before = {k.pid for k in me.children()}
    loader = Loader(dataset(urls), num_workers=2)
    for _ in range(8):
        assert len(keys(loader)) == 45
        gc.collect()
        workers = {k.pid for k in me.children()} - before
        counts = {pid: _descriptors(pid) for pid in (me.pid, *workers)}
        seen.append((workers, counts, sum(psutil.Process(pid).memory_info().rss for pid in workers)))
    pids, counts, kid_rss = seen[1]
    assert all(s[0] == pids for s in seen[1:]), "the workers were restarted"
    slots = RingConfig.create(2, None, False, None).slots  # per worker; the main process maps both rings
    for pid, (shm, other) in seen[-1][1].items():
        assert other <= counts[pid][1], f"file descriptors leak across epochs: {seen}"
        assert shm <= (2 if pid == me.pid else 1) * slots, f"more shared-memory segments than the rings hold: {seen}"
    assert seen[-1][2] - kid_rss < 8 * 2**20, "the workers' memory grows across epochs"
