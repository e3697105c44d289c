"""Everything a shardflow sbatch script says, and how a job fills it in (the plan, the run directory).

A Slurm array task is an index of cluster.contract: index I with K tasks per array task runs task ids
[I*K, (I+1)*K) of the plan, the same chunks a Kubernetes pod runs. The script carries no shard URL and no
credential: plan.json and job.pkl live in the run directory, which every node must see.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from shardflow.cluster.contract import DEFAULT_INDEX_RETRIES, chunk_count, index_retries
from shardflow.cluster.prepare import prepare_run_dir
from shardflow.errors import JobError
from shardflow.job.rerun import Rerun
from shardflow.storage.paths import is_local, local_path

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

# Slurm's default MaxArraySize is 1001 (indexes 0..1000): the automatic chunk size keeps under it
AUTO_ARRAY_TASKS = 1000
# filesystems every node of a cluster mounts at the same path (a local path on one is accepted)
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs",
                                "fuse.glusterfs", "fuse.sshfs", "panfs", "wekafs", "fuse.weka", "orangefs",
                                "pvfs2", "fuse.juicefs", "fuse.cephfs", "cifs", "smb3"})
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(\d+-\d+)$|^(UNLIMITED|INFINITE)$", re.IGNORECASE)
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class SlurmOptions:
    """The sbatch script's settings (the CLI's flags, `job.to_slurm(**options)`, `job.run("slurm", ...)`)."""

    run_dir: str
    tasks: int
    name: str = "shardflow"
    tasks_per_array_task: int | None = None  # None: 1, or more to stay within AUTO_ARRAY_TASKS
    array_parallelism: int | None = None  # `%N`: array tasks running at once (None: as many as Slurm gives)
    partition: str | None = None
    time: str | None = None  # sbatch --time (e.g. 4:00:00, 1-00:00:00)
    cpus_per_task: int = 1  # also the threads of torch/OpenMP/MKL/OpenBLAS in the worker
    mem: str | None = None  # sbatch --mem (e.g. 8G)
    gpus: int = 0  # GPUs per array task
    gpu_flag: str = "gres"  # "gres": --gres=gpu:N; "gpus-per-task": --gpus-per-task=N
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    sbatch_args: Sequence[str] = ()  # any other sbatch option, e.g. "--reservation=x"
    setup: Sequence[str] = ()  # shell lines run first: `module load ...`, `source venv/bin/activate`
    container: str | None = None  # pyxis/enroot image: the worker runs under `srun --container-image`
    container_mounts: Sequence[str] = ()  # pyxis --container-mounts SRC:DST entries
    command: str = "shardflow"  # how the nodes start shardflow (after the setup lines)
    log_dir: str | None = None  # where Slurm writes each array task's log (default: the submit directory)
    retries: int = DEFAULT_INDEX_RETRIES  # exit 75 or a killed worker, per array task (from_job: the job's)
    signal_seconds: int = 90  # the warning signal (USR1) this long before the time limit
    storage_options: Sequence[str] = ()  # `--storage-option KEY=VALUE` items for the worker (never secrets)
    env: Sequence[tuple[str, str]] = field(default_factory=tuple)  # plain variables exported by the script

    def __post_init__(self) -> None:
        _check_one_line(self)
        if self.tasks < 1:
            raise JobError("the plan has no tasks")
        for name in ("tasks_per_array_task", "array_parallelism", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise JobError(f"{name.replace('_', '-')} must be >= 1, not {value}")
        if self.retries < 0 or self.gpus < 0 or self.signal_seconds < 0:
            raise JobError("retries, gpus and signal seconds must be >= 0")
        if self.gpu_flag not in ("gres", "gpus-per-task"):
            raise JobError(f"gpu flag {self.gpu_flag!r}: choose 'gres' (--gres=gpu:N) or 'gpus-per-task'")
        if self.time is not None and not _TIME.match(self.time.strip()):
            raise JobError(f"--time {self.time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS, UNLIMITED)")
        for arg in self.sbatch_args:
            if not arg.startswith("-") or "\n" in arg:
                raise JobError(f"--sbatch-arg {arg!r}: give one sbatch option such as --reservation=NAME")

    @property
    def per_array_task(self) -> int:
        """Tasks per array task: as given, else the fewest that keep the array within AUTO_ARRAY_TASKS."""
        return self.tasks_per_array_task or max(1, math.ceil(self.tasks / AUTO_ARRAY_TASKS))

    @property
    def array_tasks(self) -> int:
        return chunk_count(self.tasks, self.per_array_task)

    def chunk_indexes(self, task_ids: Sequence[int]) -> list[int]:
        """The array indexes whose chunks hold any of `task_ids` (what a resumed run submits)."""
        return sorted({task_id // self.per_array_task for task_id in task_ids})


# every option written into the script as it is (#SBATCH lines, comments, setup lines) rather than
# shell-quoted: a newline in one would add a line of its own (`--partition $'cpu\n#SBATCH --wrap=evil'`).
# The rest (env values, container, command, storage options) go through shlex.quote.
_VERBATIM = ("name", "partition", "time", "mem", "account", "qos", "constraint", "exclude", "log_dir", "run_dir")
_VERBATIM_LISTS = ("setup", "sbatch_args")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _flag(name: str) -> str:
    return {"sbatch_args": "--sbatch-arg"}.get(name, "--" + name.replace("_", "-"))


def _check_one_line(opts: SlurmOptions) -> None:
    """Refuse a control character (newline, tab, escape...) in any value the script writes: each
    must stay on its own line. `setup` is one shell line per item (give --setup once per line)."""
    values = [(name, getattr(opts, name)) for name in _VERBATIM]
    values += [(name, item) for name in _VERBATIM_LISTS for item in getattr(opts, name)]
    for name, value in values:
        if isinstance(value, str) and _CONTROL.search(value):
            raise JobError(f"{_flag(name)} {value!r} holds a control character (newline, tab...): each value "
                           "is one line of the sbatch script" + ("; give --setup once per line"
                                                                 if name == "setup" else ""))
    for key, _ in opts.env:
        if not _ENV_NAME.match(key):
            raise JobError(f"--env {key!r} is not a variable name (letters, digits and _, not first a digit)")


def job_name(text: str) -> str:
    """A job name squeue shows whole: letters, digits, '_', '.', '-'."""
    return _NAME.sub("-", text).strip("-")[:60] or "shardflow"


def mount_type(path: str, mounts_file: str = "/proc/mounts") -> str | None:
    """The filesystem type of the mount holding `path` (longest mount point), None when unknown."""
    try:
        with open(mounts_file, encoding="utf-8") as mounts:
            entries = [line.split()[:3] for line in mounts if len(line.split()) >= 3]
    except OSError:
        return None
    best, kind = "", None
    path = posixpath.normpath(os.path.realpath(path) if os.path.exists(path) else path)
    for _, point, fstype in entries:
        point = point.replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def check_shared(url: str, what: str, shared_fs: bool) -> None:
    """Refuse a local path the compute nodes may not see: relative, or on a disk not known to be shared.

    `shared_fs` is the user saying the path is shared (a site filesystem /proc/mounts does not name);
    an object store URL (s3://, gs://) is always fine.
    """
    if not is_local(url):
        return
    path = local_path(url)
    if not posixpath.isabs(path):
        raise JobError(f"{what} {url} is a relative path, which the array tasks resolve on their own node: give an "
                       "absolute path on a shared filesystem, or an object-store URL (s3://, gs://)")
    if shared_fs:
        return
    kind = mount_type(path)
    if kind not in SHARED_FILESYSTEMS:
        raise JobError(f"{what} {url} is on this machine's {kind or 'local'} disk, which other nodes may not see: "
                       "give an object-store URL (s3://, gs://) or a path on a shared filesystem, and pass "
                       "--shared-fs (shared_fs=True) when it is one")


def from_job(job: "ShardJob", *, prepare: bool = True, rerun: Rerun = Rerun(), shared_fs: bool = False,
             **options: Any) -> SlurmOptions:
    """SlurmOptions for `job`; with `prepare`, the plan and job.pkl are written to its run dir first.

    The run directory and the outputs must be where every node sees them (check_shared).
    """
    from shardflow.cluster.manifests.common import worker_storage_options

    check_shared(job.run_dir, "run directory", shared_fs)
    outputs = job.spec.outputs
    first_output = outputs if isinstance(outputs, str) else (outputs[0] if outputs else None)
    if isinstance(first_output, str):
        check_shared(first_output, "output", shared_fs)
    if prepare:
        prepare_run_dir(job, rerun)
    if options.get("retries") is None:
        options["retries"] = index_retries(job.spec.io_retries)
    options.setdefault("name", job_name(f"shardflow-{job.name}"))
    if "storage_options" not in options:
        options["storage_options"] = worker_storage_options(job, job.run_dir, warn=False)  # secrets: env
    return SlurmOptions(run_dir=job.run_dir, tasks=job.task_count(), **options)
