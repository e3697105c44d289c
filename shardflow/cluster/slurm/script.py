"""The sbatch script of a planned job: one job array, and the same script as its finalize job.

Written the way a Slurm user writes one by hand: `#SBATCH` lines first, then the setup lines
(`module load ...`, `source venv/bin/activate`), then `shardflow worker` for SLURM_ARRAY_TASK_ID. The
bash around the worker carries out the exit-code contract (cluster.contract) where Slurm has no
podFailurePolicy: 0 and 65 end the array task, 75 or a killed worker is retried in the same allocation
(bounded), 78 cancels the whole array. The warning signal (`--signal=B:USR1@90`) reaches the batch shell,
which passes it to the worker: it stops cleanly, its temp outputs are removed, and the array task is
requeued. Submitted again with `SHARDFLOW_STEP=finalize` (and a dependency), it writes summary.json.
"""

from __future__ import annotations

import shlex
from typing import Sequence

from shardflow.cluster.contract import EXIT_BAD_INPUT, EXIT_OK, EXIT_RETRY, EXIT_STOP, SLURM_INDEX_ENV
from shardflow.cluster.slurm.options import SlurmOptions
from shardflow.task.threads import THREAD_VARIABLES

STEP_ENV = "SHARDFLOW_STEP"  # "finalize": the script writes summary.json instead of running a chunk
PREEMPT_SIGNAL = "USR1"


def array_ranges(indexes: Sequence[int]) -> str:
    """Slurm's --array syntax for sorted `indexes`: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    parts: list[str] = []
    start = prev = None
    for index in indexes:
        if prev is not None and index == prev + 1:
            prev = index
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = index
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def array_spec(opts: SlurmOptions, indexes: Sequence[int] | None = None) -> str:
    """The --array value: every index (or `indexes`, a resumed run's), with `%N` when limited."""
    ranges = array_ranges(range(opts.array_tasks) if indexes is None else indexes)
    return ranges + (f"%{opts.array_parallelism}" if opts.array_parallelism else "")


def sbatch_lines(opts: SlurmOptions) -> list[str]:
    """The `#SBATCH` directives, in the order a person reads them."""
    out = [f"--job-name={opts.name}", f"--array={array_spec(opts)}", "--nodes=1", "--ntasks=1",
           f"--cpus-per-task={opts.cpus_per_task}"]
    for flag, value in (("mem", opts.mem), ("time", opts.time), ("partition", opts.partition),
                        ("account", opts.account), ("qos", opts.qos), ("constraint", opts.constraint),
                        ("exclude", opts.exclude)):
        if value:
            out.append(f"--{flag}={value}")
    if opts.gpus:
        out.append(f"--gres=gpu:{opts.gpus}" if opts.gpu_flag == "gres" else f"--gpus-per-task={opts.gpus}")
    logs = (opts.log_dir.rstrip("/") + "/") if opts.log_dir else ""
    out += [f"--output={logs}%x-%A_%a.out", "--open-mode=append", "--requeue"]
    if opts.signal_seconds:
        out.append(f"--signal=B:{PREEMPT_SIGNAL}@{opts.signal_seconds}")
    out += list(opts.sbatch_args)
    return [f"#SBATCH {line}" for line in out]


def _launcher(opts: SlurmOptions) -> str:
    """How the worker starts, as a bash array: the command, or srun under pyxis/enroot in the image."""
    argv = shlex.split(opts.command)
    if opts.container:
        mounts = [f"--container-mounts={','.join(opts.container_mounts)}"] if opts.container_mounts else []
        argv = ["srun", "--ntasks=1", f"--container-image={opts.container}", *mounts, *argv]
    return " ".join(shlex.quote(arg) for arg in argv)


# The warning signal (--signal=B:USR1) and scancel's SIGTERM reach the batch shell only: passed on.
_FORWARD = f"""# The warning signal (--signal=B:{PREEMPT_SIGNAL}) and scancel's SIGTERM reach this shell: pass them on.
worker=""
preempted=0
cancelled=0
trap 'preempted=1; [[ -n "$worker" ]] && kill -{PREEMPT_SIGNAL} "$worker" 2>/dev/null' {PREEMPT_SIGNAL}
trap 'cancelled=1; [[ -n "$worker" ]] && kill -TERM "$worker" 2>/dev/null' TERM
run() {{  # run "$@" in the background and wait for it through any trapped signal; its status
    "$@" &
    worker=$!
    while :; do
        wait "$worker"
        code=$?
        kill -0 "$worker" 2>/dev/null || break
    done
    worker=""
    return "$code"
}}
"""


def _header(opts: SlurmOptions) -> list[str]:
    return [
        "#!/bin/bash",
        f"# shardflow job array: {opts.tasks} tasks in {opts.array_tasks} array tasks of {opts.per_array_task}.",
        f"# Array tasks read plan.json and job.pkl from {opts.run_dir} (written before submitting).",
        "# Submit the array, then the finalize job that writes summary.json (shardflow slurm --submit does both):",
        "#   ID=$(sbatch --parsable THIS_SCRIPT)",
        f"#   sbatch --dependency=afterany:$ID --array=0 --export=ALL,{STEP_ENV}=finalize "
        f"--job-name={opts.name}-finalize THIS_SCRIPT",
        f"# Worker exit codes: {EXIT_OK} done, {EXIT_BAD_INPUT} bad input (not retried), {EXIT_RETRY} transient "
        f"(retried here up to {opts.retries} times), {EXIT_STOP} fatal (the whole array is cancelled).",
    ]


def _preamble(opts: SlurmOptions) -> str:
    """Variables (threads from the CPUs Slurm gives, unless set), the user's exports and setup lines."""
    threads = "\n".join(f'export {name}="${{{name}:-${{SLURM_CPUS_PER_TASK:-{opts.cpus_per_task}}}}}"'
                        for name in THREAD_VARIABLES)
    env = "\n".join(f"export {name}={shlex.quote(value)}" for name, value in opts.env)
    setup = "\n".join(opts.setup)
    return "\n".join(part for part in ("export PYTHONUNBUFFERED=1", threads, env, setup) if part)


def _steps(opts: SlurmOptions) -> str:
    """The finalize step, and the array task's loop applying the exit-code contract."""
    storage = "".join(f" --storage-option {shlex.quote(item)}" for item in opts.storage_options)
    return f"""if [[ "${{{STEP_ENV}:-}}" == finalize ]]; then
    run "${{SHARDFLOW[@]}}" worker --run-dir "$RUN_DIR" --finalize{storage}
    exit $?
fi

TASK="${{SLURM_ARRAY_JOB_ID}}_${{{SLURM_INDEX_ENV}}}"
attempt=0
while :; do
    run "${{SHARDFLOW[@]}}" worker --run-dir "$RUN_DIR" --tasks-per-index {opts.per_array_task} --index \
"${SLURM_INDEX_ENV}"{storage}
    code=$?
    if (( preempted )); then
        echo "shardflow: array task $TASK stopped by the warning signal (exit $code); requeued" >&2
        scontrol requeue "$TASK"
        exit {EXIT_RETRY}
    fi
    (( cancelled )) && exit "$code"
    case "$code" in
        {EXIT_OK}|{EXIT_BAD_INPUT}) exit "$code" ;;
        {EXIT_STOP}) echo "shardflow: fatal for the whole run: cancelling array job $SLURM_ARRAY_JOB_ID" >&2
            scancel "$SLURM_ARRAY_JOB_ID"
            exit "$code" ;;
    esac
    if (( attempt >= RETRIES )); then
        echo "shardflow: array task $TASK failed (exit $code) after $attempt retries" >&2
        exit "$code"
    fi
    attempt=$((attempt + 1))
    echo "shardflow: array task $TASK: transient failure (exit $code), retry $attempt of $RETRIES" >&2
    sleep $((attempt * attempt))
done
"""


def render(opts: SlurmOptions) -> str:
    """The script's text (bash)."""
    variables = f"RUN_DIR={shlex.quote(opts.run_dir)}\nRETRIES={opts.retries}\nSHARDFLOW=({_launcher(opts)})\n"
    return "\n".join([*_header(opts), *sbatch_lines(opts), "", _preamble(opts), "set -uo pipefail", "",
                      variables, _FORWARD, _steps(opts)])
