"""Talking to Slurm's commands: sbatch, squeue, scancel (and nothing else of Slurm is needed).

Every failure is one line naming the command and what it said (a login node without Slurm, a
partition that does not exist, an account not allowed): Slurm's own message is the useful part.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import time
from typing import Sequence

from shardflow.errors import JobError

COMMENT_PREFIX = "shardflow:"  # sbatch --comment of a run's array job: "shardflow:<run dir>"
FINALIZE_COMMENT_PREFIX = "shardflow-finalize:"  # ... and of its finalize job (not a second writer)
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED",
                           "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESV_DEL_HOLD"})


def slurm_command(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 60.0) -> str:
    """Run a Slurm client command; its stdout, or JobError with its stderr in one line."""
    if shutil.which(argv[0]) is None:
        raise JobError(f"{argv[0]} not found: run this on a Slurm login node (or install slurm-client)")
    try:
        result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobError(f"{argv[0]} did not answer in {timeout:.0f} s (is slurmctld reachable?)") from None
    if result.returncode != 0:
        said = " ".join((result.stderr or result.stdout).split()) or f"exit {result.returncode}"
        raise JobError(f"{' '.join(argv[:2])} failed: {said}")
    return result.stdout


def sbatch(script: str, args: Sequence[str] = ()) -> str:
    """Submit `script` (given on stdin) with extra sbatch `args`; the job id."""
    out = slurm_command(["sbatch", "--parsable", *args], stdin=script)
    job_id = out.strip().split(";")[0]  # "id" or "id;cluster"
    if not job_id.isdigit():
        raise JobError(f"sbatch printed {out.strip()!r}, not a job id")
    return job_id


def states(job_ids: Sequence[str]) -> dict[str, str]:
    """{"ID" or "ID_INDEX": state} of the jobs (and array tasks) squeue still knows, active ones only."""
    if not job_ids:
        return {}
    try:
        out = slurm_command(["squeue", "--noheader", "--array", f"--jobs={','.join(job_ids)}", "--format=%i %T"])
    except JobError as exc:
        if "Invalid job id" in str(exc):  # every job ended long enough ago to be forgotten
            return {}
        raise
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in ACTIVE_STATES:
            found[parts[0]] = parts[1]
    return found


def queued_for(run_dir: str) -> list[str]:
    """Ids of this user's active array jobs submitted for `run_dir` (by their comment)."""
    out = slurm_command(["squeue", "--noheader", f"--user={getpass.getuser()}", "--format=%F|%T|%k"])
    ids = []
    for line in out.splitlines():
        job_id, _, rest = line.partition("|")
        state, _, comment = rest.partition("|")
        if comment.strip() == COMMENT_PREFIX + run_dir and state.strip() in ACTIVE_STATES:
            ids.append(job_id.strip())
    return sorted(set(ids), key=int)


def scancel(job_ids: Sequence[str], *, wait: float = 0.0) -> None:
    """Cancel jobs (an array id cancels all its tasks); ids already gone are no error. With `wait`, up to
    that many seconds until squeue no longer lists them (their workers have stopped writing)."""
    if not job_ids:
        return
    try:
        slurm_command(["scancel", *job_ids])
    except JobError as exc:
        if "Invalid job id" not in str(exc) and "already completing" not in str(exc):
            raise
    deadline = time.monotonic() + wait
    while wait and states(job_ids) and time.monotonic() < deadline:
        time.sleep(0.5)
