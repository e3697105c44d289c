"""ShardJob: what the user defines, a function plus its settings as one value (JobSpec), and its plan.

A job is a value: its settings are a frozen JobSpec (task/spec.py), variants are made with
`replace()`, and nothing outside sets an attribute (which is refused). What it caches (the plan, the
codecs, the run directory) is rebuilt where a variant's settings invalidate it. The plan is a list of
small Task values computed once from the specs and written to the run directory; backends only decide
where `run_task(task, job.task_context())` executes.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import uuid
from itertools import islice
from typing import Any, Callable

from shardflow.errors import JobError, RunStateError
from shardflow.job import code_origin, guard
from shardflow.job.backend_registry import front_end
from shardflow.job.extend import extend_stored
from shardflow.job.inputs import input_urls, input_views, job_decoder, views_setting
from shardflow.job.lazy_plan import table_from_specs
from shardflow.job.naming import check_parts_apart, first_output_folder, output_names
from shardflow.job.rerun import Prepared, Rerun
from shardflow.rundir.plan_store import (
    check_readable,
    plan_fingerprint,
    plan_from_markers,
    plan_tasks,
    same_table,
)
from shardflow.rundir.retry import forget_tasks_that_dropped_samples, retry_note
from shardflow.rundir.run_dir import RunDir
from shardflow.rundir.tasks import Task
from shardflow.shards.spec import is_spec
from shardflow.storage import options as so
from shardflow.storage.pipes import refuse_pipes
from shardflow.storage.specs import count
from shardflow.task.context import TaskContext
from shardflow.task.spec import SETTING_NAMES, UNLIMITED, JobSpec, setting_default
from shardflow.task.worker_fn import PerWorker, SetupCall, per_worker

__all__ = ["ShardJob", "UNLIMITED"]

# which cached parts of a job stay valid in a copy made by replace(): each with the settings it depends on
_CACHES = {
    "_tasks": ("inputs", "outputs", "inputs_per_task"),
    "_run_dir_url": ("inputs", "outputs", "inputs_per_task", "run_dir", "name"),
    "_rundir": ("inputs", "outputs", "inputs_per_task", "run_dir", "name", "storage_options", "retry_budget"),
    "_decoder": ("decode", "allow_pickle", "device", "inputs", "storage_options"),
    "_encoder": ("encode",),
}


class ShardJob:
    """A per-sample function mapped over input shards into output shards: `fn` plus a JobSpec.

    fn(sample) returns a dict (1:1), None (drop), or an iterable of dicts (1:N, keys unique), or
    raises SkipSample(reason). `outputs` is either a spec with one shard per task (matched by
    position) or a pattern with fields {task}, {name} (input shard name without .tar) and {part}
    (rollover part within a task).

    fn may be a class: `fn_args`/`fn_kwargs` construct it once per worker process (a model loaded
    once), then the instance is called. `batch_size=N` calls fn with a list of up to N decoded samples
    (`collate=True`: a dict of columns) and takes back a list of samples or a dict of columns
    (task/batch.py). `device` ("cpu", "cuda", "auto") is the device the job asks for (task/devices.py).

    The keywords are the fields of `shardflow.task.spec.JobSpec` (each documented there); a job is a
    value: read a setting as `job.spec.<name>` (or `job.<name>`), make a variant with
    `job.replace(name=value)`. Setting an attribute is refused.
    """

    spec: JobSpec
    fn: Any

    def __init__(self, fn: Callable[..., Any], inputs: Any = None, outputs: Any = None, *,
                 spec: JobSpec | None = None, **settings: Any) -> None:
        if not callable(fn) and not isinstance(fn, PerWorker):
            raise JobError(f"fn must be callable, got {type(fn).__name__}")
        located = {k: v for k, v in (("inputs", inputs), ("outputs", outputs)) if v is not None}
        spec = (spec or JobSpec()).replace(**located, **settings)  # unknown names refused there
        made = per_worker(fn, spec.fn_args, spec.fn_kwargs)  # a class: made once per worker
        if spec.name is None:
            spec = spec.replace(name=getattr(fn, "__name__", None) or getattr(made, "label", "job"))
        _set(self, fn=fn, spec=spec, _per_worker=made, _identity=uuid.uuid4().hex, _tasks=None, _decoder=None,
             _encoder=None, _run_dir_url=spec.run_dir, _rundir=None)

    # -- a value -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a ShardJob is a value: use job.replace({name}=...) for a job with another {name}")

    def __getattr__(self, name: str) -> Any:
        """Settings read as attributes (`job.decode`): the spec's fields."""
        if name in SETTING_NAMES and "spec" in self.__dict__:
            return getattr(self.__dict__["spec"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def replace(self, **changes: Any) -> ShardJob:
        """This job with other settings (`dataclasses.replace` of its spec): trials, debug runs, a run
        directory bound on a worker. Parts built once (codecs, the plan) are kept where still valid."""
        new = ShardJob.__new__(ShardJob)
        spec = self.spec.replace(**changes)
        made = self._per_worker if not {"fn_args", "fn_kwargs"} & set(changes) else \
            per_worker(self.fn, spec.fn_args, spec.fn_kwargs)
        identity = self._identity if made is self._per_worker else uuid.uuid4().hex
        kept = {name: getattr(self, name) if not set(depends) & set(changes) else None
                for name, depends in _CACHES.items()}
        if kept["_run_dir_url"] is None:
            kept["_run_dir_url"] = spec.run_dir
        _set(new, fn=self.fn, spec=spec, _per_worker=made, _identity=identity, **kept)
        return new

    def at_run_dir(self, run_dir: RunDir) -> ShardJob:
        """This job using `run_dir`: this process may reach the run directory by another URL or with other
        options than the process that planned the job (a pod, a Dask worker)."""
        bound = self.replace(run_dir=run_dir.url)
        _set(bound, _rundir=run_dir)
        return bound

    def with_plan(self, tasks: list[Task]) -> ShardJob:
        """This job over an explicit list of tasks instead of the plan its specs give (trials)."""
        planned = self.replace()
        _set(planned, _tasks=list(tasks))
        return planned

    # pickled to workers: leave caches behind, they are cheap to rebuild
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tasks"] = None
        state["_rundir"] = None
        state["_code_origin"] = code_origin.capture(self.fn)  # tracebacks name the user's file: see code_origin
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Jobs pickled before the job was a value (0.1.0 and 0.2 job.pkl: every setting an attribute)."""
        if "spec" not in state:
            state = _spec_from_attributes(state)
        origin = state.pop("_code_origin", None)
        self.__dict__.update(state)
        code_origin.restore(self.fn, origin)

    # -- where things go -----------------------------------------------------------------------
    def options_for(self, url: str) -> dict[str, Any]:
        """storage_options for `url`: flat, per-prefix (longest prefix wins), `${VAR}` resolved."""
        return so.options_for(url, self.spec.storage_options)

    @property
    def run_dir(self) -> str:
        """The run directory URL (default: `_shardflow` beside the first output shard, or
        `_shardflow-<job>-<hash>` there when `_shardflow` holds another job's plan: job.guard)."""
        if self._run_dir_url is None:  # from the outputs alone where they say it (a million tasks: no plan)
            head = first_output_folder(self.spec.outputs) if self._tasks is None else None
            if head is None:
                head = self.plan()[0].output.rpartition("/")[0] or "."
            _set(self, _run_dir_url=guard.default_run_dir(self, head))
        return self._run_dir_url

    def rundir(self) -> RunDir:
        if self._rundir is None:
            url = self.run_dir
            _set(self, _rundir=RunDir(url, self.options_for(url), retry_budget=self.spec.retry_budget))
        return self._rundir

    def task_context(self) -> TaskContext:
        """What run_task reads: the spec with the function, the cached codecs and the run directory."""
        return TaskContext(spec=self.spec, fn=self.fn if self._per_worker is None else self._per_worker,
                           run_dir=self.rundir(), run_dir_url=self.run_dir, decoder=self.make_decoder(),
                           encoder=self.make_encoder(), identity=self._identity)

    # -- the plan ------------------------------------------------------------------------------
    def plan(self) -> list[Task]:
        """The tasks of this job, computed once (one listing per input glob)."""
        if self._tasks is None:
            spec = self.spec
            inputs = input_urls(spec.inputs, self.options_for(_first(spec.inputs)))  # or a dataset spec
            per = spec.inputs_per_task
            groups = [inputs[i : i + per] for i in range(0, len(inputs), per)]
            names = output_names(spec.outputs, groups)
            if spec.maxcount or spec.maxsize:  # only a job that rolls over writes parts
                check_parts_apart(names)
            _set(self, _tasks=[
                Task(task_id, tuple(group), output, parts)
                for task_id, (group, (output, parts)) in enumerate(zip(groups, names))
            ])
        return self._tasks

    def task_count(self) -> int:
        """len(plan()), without building the tasks when plan() has not run (manifests of 1M tasks)."""
        if self._tasks is not None:
            return len(self._tasks)
        spec = self.spec
        return -(-count(spec.inputs, self.options_for(_first(spec.inputs))) // spec.inputs_per_task)

    def describe(self) -> dict[str, Any]:
        """JSON-safe description of the job for plan.json (JobSpec.describe and the function's name)."""
        return {"fn": self.fn_name(), **self.spec.describe()}

    def fn_name(self) -> str:
        """module.qualname of the function (for a class or a job file's setup(): what it makes)."""
        made = self._per_worker
        target = self.fn if made is None else (made.args[1] if made.factory is SetupCall else made.factory)
        label = made.label if made is not None else "?"
        return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', label)}"

    def settings(self) -> dict[str, Any]:
        """The settings that shape the output bytes; with the tasks they make the plan's fingerprint, so a
        rerun into the same run directory with another decode/encode/seed/rollover/params is refused
        (unless forced) instead of mixing old and new outputs. Policies (on_error, retries) are left out."""
        chosen = self.spec.settings()
        if is_spec(self.spec.inputs):  # the collections' views shape the outputs too
            views = input_views(self.spec.inputs, self.options_for(_first(self.spec.inputs)))
            chosen["views"] = json.loads(json.dumps(views_setting(views), sort_keys=True, default=repr))
        return chosen

    # -- codecs --------------------------------------------------------------------------------
    # Built once in the process that defines the job and pickled with it: codecs copy the registry
    # when created, so codecs the user registered in the main process reach every worker.
    def make_decoder(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        spec = self.spec
        if spec.decode is None and not is_spec(spec.inputs):
            return None
        if self._decoder is None:
            from shardflow.codecs.gpu import make_decoder

            inner = (make_decoder(spec.decode, allow_pickle=spec.allow_pickle, device=spec.device)
                     if spec.decode is not None else None)
            # a dataset spec's extensions / rename apply first (job/inputs.py)
            _set(self, _decoder=job_decoder(spec.inputs, self.options_for(_first(spec.inputs)), inner))
        return self._decoder

    def make_encoder(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if self._encoder is None:
            from shardflow.codecs import Encoder

            _set(self, _encoder=Encoder(**self.spec.encode))
        return self._encoder

    # -- running -------------------------------------------------------------------------------
    def prepare(self, **rerun: bool) -> RunDir:
        """Write the plan and the pickled job to the run directory (once); returns it. Keywords: those of
        job.rerun.Rerun.of (redo, force, resume_anyway, overwrite, extend, retry_failed); see prepare_run."""
        return self.prepare_run(Rerun.of(**rerun)).run_dir

    def prepare_run(self, rerun: Rerun = Rerun()) -> Prepared:
        """Write the plan and the pickled job to the run directory as `rerun` says; the run directory and
        notes of what was done beyond that (job.rerun.Prepared).

        Refuses outputs in place, existing shards under planned names that no run of this run directory
        wrote (unless `overwrite`), and a run directory planned with other settings or code (unless `redo`:
        start over; or, for code, `resume_anyway`): see job.guard. A rerun whose plan is the stored one
        skips the output checks (its first run passed them): no listing. `extend`: the inputs no stored
        task has become new tasks after the stored ones (job.extend). `retry_failed`: once the plan passed
        its checks, the done tasks that dropped samples are forgotten (rundir.retry), so that a refused
        code change has forgotten nothing.
        """
        from shardflow.job.jobrecord import save_job

        self.make_decoder()
        self.make_encoder()
        redo, resume_anyway, overwrite = rerun.redo, rerun.resume_anyway, rerun.overwrite
        notes: list[str] = []
        run_dir = self.rundir()
        run_dir.remove_stale_temps()  # a driver killed mid-write of a marker leaves one behind
        # a brace range with an output pattern is stored as a table: 1M tasks never become 1M JSON objects
        spec = self.spec
        table = None if self._tasks is not None else table_from_specs(spec.inputs, spec.outputs, spec.inputs_per_task)
        planned: dict[str, Any] = {"table": table} if table is not None else {"tasks": self.plan()}
        # a refused pipe: stops the job here, before any task or retry (a table's names are one numbered run)
        checked = planned["tasks"] if table is None else islice(plan_tasks(planned), 1)
        refuse_pipes((url for task in checked for url in (*task.inputs, task.output)), spec.allow_pipe)
        settings = self.settings()
        try:
            stored = run_dir.stored_plan()
            if redo and stored is not None:  # an equal plan is kept by a redo: its chunk files must read
                check_readable(run_dir, stored)
        except RunStateError:  # plan.json unreadable: named, "use --redo"; a redo plans again over it
            if not redo:
                raise
            stored = plan_from_markers(run_dir)  # the shards its done markers name stay its own
        if same_table(stored, table, settings):  # the stored plan: its fingerprint, without hashing N tasks
            fingerprint = stored["fingerprint"]  # type: ignore[index]
        else:
            fingerprint = plan_fingerprint(plan_tasks(planned), settings)
        if rerun.extend and stored is not None:  # new inputs: new tasks after the stored ones (job.extend)
            grown = extend_stored(self, run_dir, stored, table, settings, fingerprint, resume_anyway=resume_anyway,
                                  overwrite=overwrite)
            _set(self, _tasks=self._tasks if grown.tasks is None else grown.tasks)
            stored, fingerprint = grown.stored, grown.fingerprint
            notes.append(grown.extension.line())
        if stored is None or stored.get("fingerprint") != fingerprint:  # the stored plan passed these checks
            resumed = guard.check_outputs(self, planned.get("tasks"), table, run_dir, stored, overwrite=overwrite)
            if resumed is not None:  # the rerun's glob matched the first run's outputs: resume the plan there
                _set(self, _tasks=resumed)
                planned = {"tasks": resumed}
                fingerprint = plan_fingerprint(resumed, settings)
        code = guard.code_fingerprint(self)
        run_dir.init_plan({"job": self.describe(), **planned, "settings": settings, "code": code}, force=redo,
                          fingerprint=fingerprint, stored=stored)
        guard.check_code(self, run_dir, redo=redo, resume_anyway=resume_anyway, overwrite=overwrite,
                         retry_failed=rerun.retry_failed)
        save_job(run_dir, self)
        if rerun.retry_failed:
            notes.append(retry_note(forget_tasks_that_dropped_samples(run_dir)))
        return Prepared(run_dir, tuple(notes))

    def run(self, backend: str = "processes", **options: Any) -> Any:
        """Run the pending tasks on a backend ("serial", "processes", "dask", or any registered one);
        returns a RunReport (job/driver.py)."""
        from shardflow.job.driver import run_job

        return run_job(self, backend, **options)

    def to_kubernetes(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of a Kubernetes Indexed Job running this job; writes the plan first unless prepare=False.

        Options: parallelism, tasks_per_pod, cpu, memory, secrets, env, namespace, name, ... (see
        shardflow.cluster.manifests.ClusterOptions and docs/kubernetes.md).
        """
        return front_end("kubernetes")(self, "kubernetes", image, prepare=prepare, **options)

    def to_argo(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of an Argo Workflow running this job (same options as to_kubernetes)."""
        return front_end("argo")(self, "argo", image, prepare=prepare, **options)

    def to_slurm(self, *, prepare: bool = True, **options: Any) -> str:
        """The sbatch script of a Slurm job array running this job; writes the plan first unless prepare=False.

        Options: partition, time, cpus_per_task, mem, gpus, setup, container, shared_fs, ... (see
        shardflow.cluster.slurm.SlurmOptions and docs/slurm.md).
        """
        return front_end("slurm")(self, "slurm", None, prepare=prepare, **options)

    def __repr__(self) -> str:
        return f"ShardJob({self.fn_name()}, {self.spec!r})"


def _set(job: ShardJob, **values: Any) -> None:
    """Fill a job's own slots (construction, caches): the one way around the value's __setattr__."""
    job.__dict__.update(values)


def _spec_from_attributes(state: dict[str, Any]) -> dict[str, Any]:
    """The state of a job pickled with every setting as an attribute, as (fn, spec, caches)."""
    state = dict(state)
    settings = {name: state.pop(name) for name in SETTING_NAMES if name in state}
    for name in ("maxcount", "maxsize"):
        if settings.get(name) is not None and settings[name] >= UNLIMITED:
            settings[name] = None
    state["spec"] = JobSpec(**settings)
    state.setdefault("_per_worker", None)
    state.setdefault("_identity", "")
    state.setdefault("_run_dir_url", settings.get("run_dir"))
    return state


def _first(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    return "" if not spec or isinstance(spec, dict) else spec[0]


def _signature() -> inspect.Signature:
    """ShardJob(fn, inputs, outputs, *, <every JobSpec field>): what help() and editors show, derived from
    the spec's fields rather than written out a second time."""
    kind = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
              inspect.Parameter("outputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [inspect.Parameter(f.name, kind, default=setting_default(f.name), annotation=f.type)
               for f in dataclasses.fields(JobSpec) if f.name not in ("inputs", "outputs")]
    params.append(inspect.Parameter("spec", kind, default=None, annotation="JobSpec | None"))
    return inspect.Signature(params)


ShardJob.__signature__ = _signature()  # type: ignore[attr-defined]
