"""ShardJob: what the user defines (a per-sample function, inputs, outputs, policies) and its plan.

The plan is a list of small Task values computed once from the specs and written to the run
directory; backends only decide where `run_task(task, job)` executes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Sequence

from shardflow.errors import DEFAULT_ON_ERROR_JOB, JobError, check_on_error
from shardflow.job import guard
from shardflow.job.batch_options import BATCHING_SETTINGS, batching_context, check_batching, describe_batching
from shardflow.task.context import TaskContext
from shardflow.job.inputs import input_urls, input_views, job_decoder, views_setting
from shardflow.job.lazy_plan import table_from_specs
from shardflow.job.naming import output_names
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.task.worker_fn import PerWorker, per_worker
from shardflow.shards.spec import is_spec
from shardflow.storage import options as so
from shardflow.storage.specs import count

UNLIMITED = 1 << 62


class ShardJob:
    """A per-sample function mapped over input shards into output shards.

    fn(sample) returns a dict (1:1), None (drop), or an iterable of dicts (1:N, keys unique), or
    raises SkipSample(reason). `outputs` is either a spec with one shard per task (matched by
    position) or a pattern with fields {task}, {name} (input shard name without .tar) and {part}
    (rollover part within a task).

    fn may be a class: `fn_args`/`fn_kwargs` construct it once per worker process (a model loaded
    once), then the instance is called. `batch_size=N` calls fn with a list of up to N decoded samples
    (`collate=True`: a dict of columns) and takes back a list of samples or a dict of columns
    (task/batch.py). `device` ("cpu", "cuda", "auto") is the device the job asks for (task/devices.py).
    """

    # defaults for jobs pickled by versions without these settings (0.1.0 job.pkl)
    batch_size: int | None = None
    collate = False
    device: str | None = None
    _per_worker: PerWorker | None = None
    _identity = ""

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Any],
        inputs: str | Sequence[str],
        outputs: str | Sequence[str],
        *,
        decode: str | None = None,
        encode: dict[str, Any] | None = None,
        on_error: str = DEFAULT_ON_ERROR_JOB,
        seed: int = 0,
        maxcount: int | None = None,
        maxsize: float | None = None,
        inputs_per_task: int = 1,
        run_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_failure_rate: float = 0.5,
        io_retries: int = 3,
        retry_backoff: float = 1.0,
        allow_pickle: bool = False,
        allow_pipe: bool = False,
        name: str | None = None,
        params: dict[str, Any] | None = None,
        fn_args: Sequence[Any] = (),
        fn_kwargs: dict[str, Any] | None = None,
        batch_size: int | None = None,
        collate: bool = False,
        device: str | None = None,
    ) -> None:
        check_on_error(on_error, error=JobError)
        if inputs_per_task < 1:
            raise JobError("inputs_per_task must be >= 1")
        if not callable(fn) and not isinstance(fn, PerWorker):
            raise JobError(f"fn must be callable, got {type(fn).__name__}")
        self._per_worker = per_worker(fn, tuple(fn_args), fn_kwargs)  # a class: made once per worker
        self.batch_size, self.collate, self.device = check_batching(batch_size, collate, device)
        self._identity = uuid.uuid4().hex  # travels with the pickled job: the per-worker cache key
        self.fn = fn
        self.inputs = inputs
        self.outputs = outputs
        self.decode = decode
        self.encode = dict(encode or {})
        self.on_error = on_error
        self.seed = seed
        self.maxcount = int(maxcount) if maxcount else UNLIMITED
        self.maxsize = float(maxsize) if maxsize else float(UNLIMITED)
        self.inputs_per_task = inputs_per_task
        self.storage_options = storage_options
        self.max_failure_rate = max_failure_rate
        self.io_retries = io_retries
        self.retry_backoff = retry_backoff
        self.allow_pickle = allow_pickle
        self.allow_pipe = allow_pipe
        self.name = name or getattr(fn, "__name__", None) or getattr(self._per_worker, "label", "job")
        self.params = params
        self._tasks: list[Task] | None = None
        self._decoder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._encoder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._run_dir_url = run_dir
        self._rundir: RunDir | None = None

    # pickled to workers: leave caches behind, they are cheap to rebuild
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tasks"] = None
        state["_rundir"] = None
        return state

    # -- where things go -----------------------------------------------------------------------
    def options_for(self, url: str) -> dict[str, Any]:
        """storage_options for `url`: flat, per-prefix (longest prefix wins), `${VAR}` resolved."""
        return so.options_for(url, self.storage_options)

    @property
    def run_dir(self) -> str:
        """The run directory URL (default: `_shardflow` beside the first output shard, or
        `_shardflow-<job>-<hash>` there when `_shardflow` holds another job's plan: job.guard)."""
        if self._run_dir_url is None:
            first = self.plan()[0].output
            self._run_dir_url = guard.default_run_dir(self, first.rpartition("/")[0] or ".")
        return self._run_dir_url

    def rundir(self) -> RunDir:
        if self._rundir is None:
            self._rundir = RunDir(self.run_dir, self.options_for(self.run_dir))
        return self._rundir

    def bind_run_dir(self, run_dir: RunDir) -> None:
        """Use `run_dir` (this process may reach the run directory by another URL or other options
        than the process that planned the job: a pod, a Dask worker)."""
        self._run_dir_url = run_dir.url
        self._rundir = run_dir

    def task_context(self) -> TaskContext:
        """What run_task reads: the job's current settings with its cached codecs and run directory."""
        return TaskContext(
            run_dir=self.rundir(), run_dir_url=self.run_dir, decoder=self.make_decoder(),
            encoder=self.make_encoder(), on_error=self.on_error, seed=self.seed, maxcount=self.maxcount,
            maxsize=self.maxsize, max_failure_rate=self.max_failure_rate, io_retries=self.io_retries,
            retry_backoff=self.retry_backoff, allow_pipe=self.allow_pipe, storage_options=self.storage_options,
            debug=getattr(self, "debug", False), limit=getattr(self, "limit", None),
            **batching_context(self),
        )

    # -- the plan ------------------------------------------------------------------------------
    def plan(self) -> list[Task]:
        """The tasks of this job, computed once (one listing per input glob)."""
        if self._tasks is None:
            inputs = input_urls(self.inputs, self.options_for(_first(self.inputs)))  # or a dataset spec
            groups = [inputs[i : i + self.inputs_per_task] for i in range(0, len(inputs), self.inputs_per_task)]
            self._tasks = [
                Task(task_id, tuple(group), output, parts)
                for task_id, (group, (output, parts)) in enumerate(zip(groups, output_names(self.outputs, groups)))
            ]
        return self._tasks

    def task_count(self) -> int:
        """len(plan()), without building the tasks when plan() has not run (manifests of 1M tasks)."""
        if self._tasks is not None:
            return len(self._tasks)
        return -(-count(self.inputs, self.options_for(_first(self.inputs))) // self.inputs_per_task)

    def describe(self) -> dict[str, Any]:
        """JSON-safe description of the job for plan.json (no credentials: storage options left out)."""
        return {
            "name": self.name, "fn": f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}",
            "decode": self.decode, "encode": self.encode, "on_error": self.on_error, "seed": self.seed,
            "maxcount": None if self.maxcount == UNLIMITED else self.maxcount,
            "maxsize": None if self.maxsize >= UNLIMITED else self.maxsize,
            "inputs_per_task": self.inputs_per_task, "max_failure_rate": self.max_failure_rate,
            "params": self.params, **describe_batching(self),
        }

    def settings(self) -> dict[str, Any]:
        """The settings that shape the output bytes; with the tasks they make the plan's fingerprint, so a
        rerun into the same run directory with another decode/encode/seed/rollover/params is refused
        (unless forced) instead of mixing old and new outputs. Policies (on_error, retries) are left out."""
        described = self.describe()
        keys = ("decode", "encode", "seed", "maxcount", "maxsize", "inputs_per_task", "params",
                *BATCHING_SETTINGS.intersection(described))
        chosen = {k: described[k] for k in keys}
        if is_spec(self.inputs):  # the collections' views shape the outputs too
            chosen["views"] = views_setting(input_views(self.inputs, self.options_for(_first(self.inputs))))
        return json.loads(json.dumps(chosen, sort_keys=True, default=repr))

    # -- codecs --------------------------------------------------------------------------------
    # Built once in the process that defines the job and pickled with it: codecs copy the registry
    # when created, so codecs the user registered in the main process reach every worker.
    def make_decoder(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        if self.decode is None and not is_spec(self.inputs):
            return None
        if self._decoder is None:
            from shardflow.codecs.gpu import make_decoder

            inner = (make_decoder(self.decode, allow_pickle=self.allow_pickle, device=self.device)
                     if self.decode is not None else None)
            # a dataset spec's extensions / rename apply first (job/inputs.py)
            self._decoder = job_decoder(self.inputs, self.options_for(_first(self.inputs)), inner)
        return self._decoder

    def make_encoder(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if self._encoder is None:
            from shardflow.codecs import Encoder

            self._encoder = Encoder(**self.encode)
        return self._encoder

    # -- running -------------------------------------------------------------------------------
    def prepare(self, *, force: bool = False, redo: bool = False, resume_anyway: bool = False,
                overwrite: bool = False) -> RunDir:
        """Write the plan and the pickled job to the run directory (once); returns it.

        Refuses outputs in place, output folders holding shards this job did not write (unless
        `overwrite`) and a run directory planned with other code (unless `redo` or `resume_anyway`):
        see job.guard.
        """
        self.make_decoder()
        self.make_encoder()
        run_dir = self.rundir()
        run_dir.remove_stale_temps()  # a driver killed mid-write of a marker leaves one behind
        # a brace range with an output pattern is stored as a table: 1M tasks never become 1M JSON objects
        table = None if self._tasks is not None else table_from_specs(self.inputs, self.outputs, self.inputs_per_task)
        if table is None:
            tasks = self.plan()
            guard.check_not_in_place(tasks)
            if not overwrite:
                guard.check_foreign_shards(self, tasks, run_dir)
        else:  # from the table's folders: no Task made unless inputs and outputs share a folder
            guard.check_table(self, table, run_dir, overwrite=overwrite)
        code = guard.code_fingerprint(self)
        planned: dict[str, Any] = {"table": table} if table is not None else {"tasks": tasks}
        run_dir.init_plan({"job": self.describe(), **planned, "settings": self.settings(), "code": code}, force=force)
        guard.check_code(self, run_dir, redo=redo or force, resume_anyway=resume_anyway, overwrite=overwrite)
        run_dir.save_job(self)
        return run_dir

    def run(self, backend: str = "processes", **options: Any):
        """Run the pending tasks on a backend ("serial", "processes", "dask"); returns a RunReport."""
        from shardflow.job.driver import run_job

        return run_job(self, backend, **options)

    def to_kubernetes(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of a Kubernetes Indexed Job running this job; writes the plan first unless prepare=False.

        Options: parallelism, tasks_per_pod, cpu, memory, secrets, env, namespace, name, ... (see
        shardflow.cluster.manifests.ClusterOptions and docs/kubernetes.md).
        """
        from shardflow.cluster.manifests import render

        return render(self, "kubernetes", image, prepare=prepare, **options)

    def to_argo(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of an Argo Workflow running this job (same options as to_kubernetes)."""
        from shardflow.cluster.manifests import render

        return render(self, "argo", image, prepare=prepare, **options)


def _first(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    return "" if not spec or isinstance(spec, dict) else spec[0]
