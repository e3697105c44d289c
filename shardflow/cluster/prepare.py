"""Writing a run's plan: from the submitter's machine (`shardflow k8s/argo`), or inside the cluster.

Teams whose buckets only the cluster can write render with `--no-prepare` and run
`shardflow worker --prepare JOB ...` in the cluster (a one-off Job, or the first step of a Workflow)
before the pods start. Either way a storage failure is one line that says what to do, not a botocore
traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, TextIO

from shardflow.cluster.contract import EXIT_OK, EXIT_RETRY, EXIT_STOP
from shardflow.errors import JobError, ShardflowError
from shardflow.job.rerun import Rerun
from shardflow.storage import options as so

if TYPE_CHECKING:
    from shardflow.job.shard_job import ShardJob

_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError",
                "RefreshError", "PermissionError", "AccessDenied", "Forbidden", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "403")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def looks_like_credentials(exc: BaseException) -> bool:
    """A refused or unsigned request (no credentials, wrong ones, no permission), by name or message."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__} {seen}"
        if any(word in text for word in _CREDENTIALS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def prepare_run_dir(job: "ShardJob", rerun: Rerun = Rerun(), *, err: TextIO | None = None) -> None:
    """job.prepare_run(rerun), with any storage failure turned into a one-line JobError naming the run
    directory; what it did beyond writing the plan (tasks added by --extend, forgotten by --retry-failed)
    is said on `err` (stderr), a line each."""
    try:
        prepared = job.prepare_run(rerun)
        for note in prepared.notes:
            print(f"shardflow: {note}", file=err or sys.stderr, flush=True)
    except ShardflowError:
        raise
    except Exception as exc:  # noqa: BLE001 - botocore, gcsfs, OSError...: one line, with the way out
        where = job.run_dir
        if looks_like_credentials(exc):
            hint = ("no credentials here, or not allowed to write it: give this machine credentials (AWS_* / "
                    "GOOGLE_APPLICATION_CREDENTIALS, --storage-option), or render with --no-prepare and let the "
                    "cluster write the plan (`shardflow worker --prepare`, see docs/kubernetes.md)")
        else:
            hint = "check the URL and --storage-option, or render with --no-prepare (see docs/kubernetes.md)"
        raise JobError(f"cannot write the plan to run directory {where}: {_first_line(exc)}; {hint}") from exc


def prepare_in_cluster(jobfile: str, run_dir: str, *, inputs: str | list[str] | None, outputs: str | None,
                       overrides: Mapping[str, Any], storage_options: dict[str, Any] | None, rerun: Rerun = Rerun(),
                       out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`shardflow worker --prepare`: write plan.json and job.pkl from inside the cluster; an exit status.

    0 written (or already there, the same plan); 78 the job does not load or the run directory holds a
    different plan (fix and resubmit); 75 the run directory is unreachable (retry).
    """
    from shardflow.job.jobfile import load_job

    out, err = out or sys.stdout, err or sys.stderr
    try:
        job = load_job(jobfile, inputs=inputs, outputs=outputs, overrides=dict(overrides), run_dir=run_dir,
                       storage_options=storage_options)
        tasks = len(job.plan())
    except (ShardflowError, ValueError, KeyError) as exc:
        print(so.scrub(f"shardflow worker --prepare: {exc} (exit {EXIT_STOP})", storage_options), file=err)
        return EXIT_STOP
    except Exception as exc:  # noqa: BLE001 - listing the inputs failed: storage trouble, worth a retry
        print(so.scrub(f"shardflow worker --prepare: {_first_line(exc)} (exit {EXIT_RETRY})", storage_options),
              file=err)
        return EXIT_RETRY
    try:
        prepare_run_dir(job, rerun, err=err)
        tasks = job.task_count()  # an extended plan's (its new inputs grouped among themselves)
    except JobError as exc:
        code = EXIT_RETRY if isinstance(exc.__cause__, Exception) and not looks_like_credentials(exc) else EXIT_STOP
        print(so.scrub(f"shardflow worker --prepare: {exc} (exit {code})", storage_options), file=err)
        return code
    print(f"shardflow worker --prepare: {tasks} tasks planned in {job.run_dir}", file=out, flush=True)
    return EXIT_OK
