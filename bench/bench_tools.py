"""Shell-tool benchmarks: `shardflow map -c` per-sample overhead, `shardflow create` vs `tar`.

(a) map: one shard of N samples (a small .txt each), the command `cat *.txt > /dev/null`:
    loop       the tarproc way in plain Python: tarfile in, per sample a temp dir with the members,
               subprocess.run(["sh", "-c", CMD]), every file read back, tarfile out (temp dirs in the
               system default, as tarproc's; "loop in /dev/shm": the same on the RAM disk that
               shardflow map uses by default when it has room)
    map -p 1   `shardflow map -c CMD -b serial` (plan, run directory, safe names, clean env, timeout,
               process group, atomic output)
    map -p 4   the same with four samples' commands in flight (threads in one worker)
    The fork/exec of `sh` is the limit: the loop measures it plus the least Python around it.
(b) create: a directory of F tiny files (F/2 samples of .txt + .cls) packed by
    `tar --sort=name -cf` (the limit) and `shardflow create DIR -o out-{part:06d}.tar` (a process
    each, start-up counted for both); target >= 0.5x tar's files/s.

Run: python bench/bench_tools.py [--samples 400] [--files 100000] [--repeat 3] [--only a|b] [--dir D]
After one untimed warm-up run each, variants run back to back in each round; the table gives each
one's best round and the median over rounds of its ratio to the baseline within a round (the steadier
figure on a shared machine).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import shardflow as sf  # noqa: E402

COMMAND = "cat *.txt > /dev/null"


def make_shard(path: Path, samples: int) -> None:
    with sf.TarWriter(str(path)) as writer:
        for i in range(samples):
            writer.write({"__key__": f"s/{i:06d}", "txt": b"hello %d\n" % i, "cls": b"%d" % (i % 10)})


def loop(src: Path, dst: Path, tmpdir: str | None = None) -> None:
    """tarproc-style: a subprocess per sample in a temp dir, plain tarfile in and out."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        members = [(m, tin.extractfile(m).read()) for m in tin]  # type: ignore[union-attr]
        groups: dict[str, list[tuple[str, bytes]]] = {}
        for member, data in members:
            key, _, ext = member.name.partition(".")
            groups.setdefault(key, []).append((ext, data))
        for key, parts in groups.items():
            with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
                base = key.rsplit("/", 1)[-1]
                for ext, data in parts:
                    Path(tmp, f"{base}.{ext}").write_bytes(data)
                subprocess.run(["sh", "-c", COMMAND], cwd=tmp, check=True, stdin=subprocess.DEVNULL)
                for name in sorted(os.listdir(tmp)):
                    data = Path(tmp, name).read_bytes()
                    info = tarfile.TarInfo(f"{key}.{name.partition('.')[2]}")
                    info.size = len(data)
                    tout.addfile(info, io.BytesIO(data))


def shardflow_map(src: Path, out: Path, parallel: int) -> None:
    job = sf.ShellJob(COMMAND, str(src), str(out / "{name}.tar"), parallel=parallel)
    report = job.run("serial", progress=False)
    assert report.ok and report.stats.samples_out == report.stats.samples_in, str(report)


def bench_map(samples: int, repeat: int, work: Path) -> list[str]:
    src = work / "in.tar"
    make_shard(src, samples)
    variants = {
        "loop": lambda i: loop(src, work / f"loop-{i}.tar"),
        "loop in /dev/shm": lambda i: loop(src, work / f"loopm-{i}.tar", "/dev/shm"),
        "map -p 1": lambda i: shardflow_map(src, work / f"p1-{i}", 1),
        "map -p 4": lambda i: shardflow_map(src, work / f"p4-{i}", 4),
    }
    return table(variants, repeat, samples, "samples", f"(a) map -c '{COMMAND}', {samples} samples")


def make_tree(root: Path, files: int) -> None:
    for i in range(files // 2):
        folder = root / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"{i:07d}.txt").write_bytes(b"text %d\n" % i)
        (folder / f"{i:07d}.cls").write_bytes(b"%d" % (i % 10))


def bench_create(files: int, repeat: int, work: Path) -> list[str]:
    root = work / "tree"
    started = time.perf_counter()
    make_tree(root, files)
    made = time.perf_counter() - started
    exe = shutil.which("shardflow", path=os.path.dirname(sys.executable)) or "shardflow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def tar(i: int) -> None:
        folders = sorted(os.listdir(root))
        subprocess.run(["tar", "--sort=name", "-cf", str(work / f"tar-{i}.tar"), *folders], cwd=root, check=True)

    def create(i: int) -> None:
        subprocess.run([exe, "create", str(root), "-o", str(work / f"c{i}" / "out-{part:06d}.tar"),
                        "--no-progress"], check=True, env=env, stdout=subprocess.DEVNULL)

    title = f"(b) create from {files} files ({files // 2} samples; tree written in {made:.1f} s)"
    return table({"tar --sort=name": tar, "shardflow create": create}, repeat, files, "files", title)


def table(variants: dict, repeat: int, count: int, unit: str, title: str) -> list[str]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up (imports, page cache), not timed
        fn(-1)
    for round_ in range(repeat):
        for name, fn in variants.items():
            started = time.perf_counter()
            fn(round_)
            times[name].append(time.perf_counter() - started)
    base = next(iter(variants))
    lines = [title, f"  {'variant':18} {'best s':>8} {unit + '/s':>12} {'ms/' + unit[:-1]:>10} {'x baseline':>11}"]
    for name, runs in times.items():
        ratio = statistics.median(times[base][r] / runs[r] for r in range(repeat))
        best = min(runs)
        lines.append(f"  {name:18} {best:8.2f} {count / best:12.0f} {1000 * best / count:10.3f} {ratio:10.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["a", "b"])
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the shard, the tree and all outputs go [default: /dev/shm, a RAM disk: "
                        "both tools then pay CPU, not a shared disk's latency]")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, tar: "
          + subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    print(f"work directory under {args.dir or tempfile.gettempdir()}")
    with tempfile.TemporaryDirectory(prefix="bench-tools-", dir=args.dir) as tmp:
        work = Path(tmp)
        if args.only in (None, "a"):
            print("\n".join(bench_map(args.samples, args.repeat, work)), flush=True)
        if args.only in (None, "b"):
            print("\n".join(bench_create(args.files, args.repeat, work)), flush=True)


if __name__ == "__main__":
    main()
