"""ShardJob: what the user defines (a per-sample function, inputs, outputs, policies) and its plan.

The plan is a list of small Task values computed once from the specs and written to the run
directory; backends only decide where `run_task(task, job)` executes.
"""

from __future__ import annotations

import json
import re
import string
from typing import Any, Callable, Sequence

import braceexpand

from . import storage_options as so
from . import urls
from .errors import JobError
from .rundir import RunDir
from .task import Task, stable_seed

ON_ERROR = ("skip", "warn", "raise")
_FIELD = re.compile(r"\{(task|name|part)(?:[:!][^}]*)?\}")
_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
UNLIMITED = 1 << 62


def shard_stem(url: str) -> str:
    """Basename of a shard without its tar suffix: `s3://b/train-000003.tar.gz` -> `train-000003`."""
    base = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in _TAR_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def fill_pattern(pattern: str, values: dict[str, Any]) -> str:
    """Fill the named fields of an output pattern, keeping `{part...}` for the writer to fill."""
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(pattern):
        out.append(_escape(literal))
        if field is None:
            continue
        if field == "part":
            out.append("{part" + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}")
        elif field in values:
            out.append(_escape(format(values[field], spec or "")))
        else:
            raise JobError(f"output pattern {pattern!r} has unknown field {{{field}}}; use {{task}}, {{name}}, {{part}}")
    return "".join(out)


def with_part_suffix(url: str) -> str:
    """Format string for rollover parts of a fixed output name: `x.tar` -> `x_{part:03d}.tar`."""
    head, slash, base = url.rpartition("/")
    stem, dot, rest = base.partition(".")
    return _escape(head + slash + stem) + "_{part:03d}" + _escape(dot + rest)


class ShardJob:
    """A per-sample function mapped over input shards into output shards.

    fn(sample) returns a dict (1:1), None (drop), or an iterable of dicts (1:N, keys unique), or
    raises SkipSample(reason). `outputs` is either a spec with one shard per task (matched by
    position) or a pattern with fields {task}, {name} (input shard name without .tar) and {part}
    (rollover part within a task).
    """

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Any],
        inputs: str | Sequence[str],
        outputs: str | Sequence[str],
        *,
        decode: str | None = None,
        encode: dict[str, Any] | None = None,
        on_error: str = "skip",
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
    ) -> None:
        if on_error not in ON_ERROR:
            raise JobError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
        if inputs_per_task < 1:
            raise JobError("inputs_per_task must be >= 1")
        if not callable(fn):
            raise JobError(f"fn must be callable, got {type(fn).__name__}")
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
        self.name = name or getattr(fn, "__name__", "job")
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
        """The run directory URL (default: `_shardflow` beside the first output shard)."""
        if self._run_dir_url is None:
            first = self.plan()[0].output
            head = first.rpartition("/")[0] or "."
            self._run_dir_url = urls.join(head, "_shardflow")
        return self._run_dir_url

    def rundir(self) -> RunDir:
        if self._rundir is None:
            self._rundir = RunDir(self.run_dir, self.options_for(self.run_dir))
        return self._rundir

    def temp_tag(self, task: Task) -> str:
        """Tag in the temp names of a task's shards, unique to (run directory, task)."""
        return f"{stable_seed(self.run_dir) % 16**8:08x}t{task.id}"

    # -- the plan ------------------------------------------------------------------------------
    def plan(self) -> list[Task]:
        """The tasks of this job, computed once (one listing per input glob)."""
        if self._tasks is None:
            inputs = urls.expand(self.inputs, self.options_for(_first(self.inputs)))
            groups = [inputs[i : i + self.inputs_per_task] for i in range(0, len(inputs), self.inputs_per_task)]
            self._tasks = [
                Task(task_id, tuple(group), output, parts)
                for task_id, (group, (output, parts)) in enumerate(zip(groups, self._output_names(groups)))
            ]
        return self._tasks

    def _output_names(self, groups: list[list[str]]) -> list[tuple[str, str]]:
        outputs = self.outputs
        if isinstance(outputs, str) and _FIELD.search(outputs):
            names = []
            for task_id, group in enumerate(groups):
                filled = fill_pattern(outputs, {"task": task_id, "name": shard_stem(group[0])})
                if "{part" in filled:
                    names.append((filled.format(part=0), filled))
                else:
                    unescaped = filled.replace("{{", "{").replace("}}", "}")
                    names.append((unescaped, with_part_suffix(unescaped)))
            if len({n for n, _ in names}) != len(names):
                raise JobError(f"output pattern {outputs!r} gives the same name to several tasks; add {{task}} or {{name}}")
            return names
        specs = [outputs] if isinstance(outputs, str) else list(outputs)
        expanded = [url for spec in specs for url in braceexpand.braceexpand(spec)]
        if len(expanded) != len(groups):
            raise JobError(
                f"outputs name {len(expanded)} shards but the inputs make {len(groups)} tasks; give one output "
                f"per task, or a pattern such as 'out/{{name}}.tar' or 'out/part-{{task:06d}}-{{part:03d}}.tar'"
            )
        if len(set(expanded)) != len(expanded):
            raise JobError("outputs name the same shard more than once")
        return [(url, with_part_suffix(url)) for url in expanded]

    def describe(self) -> dict[str, Any]:
        """JSON-safe description of the job for plan.json (no credentials: storage options left out)."""
        return {
            "name": self.name, "fn": f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}",
            "decode": self.decode, "encode": self.encode, "on_error": self.on_error, "seed": self.seed,
            "maxcount": None if self.maxcount == UNLIMITED else self.maxcount,
            "maxsize": None if self.maxsize >= UNLIMITED else self.maxsize,
            "inputs_per_task": self.inputs_per_task, "max_failure_rate": self.max_failure_rate,
            "params": self.params,
        }

    def settings(self) -> dict[str, Any]:
        """The settings that shape the output bytes; with the tasks they make the plan's fingerprint, so a
        rerun into the same run directory with another decode/encode/seed/rollover/params is refused
        (unless forced) instead of mixing old and new outputs. Policies (on_error, retries) are left out."""
        described = self.describe()
        keys = ("decode", "encode", "seed", "maxcount", "maxsize", "inputs_per_task", "params")
        return json.loads(json.dumps({k: described[k] for k in keys}, sort_keys=True, default=repr))

    # -- codecs --------------------------------------------------------------------------------
    # Built once in the process that defines the job and pickled with it: codecs copy the registry
    # when created, so codecs the user registered in the main process reach every worker.
    def make_decoder(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        if self.decode is None:
            return None
        if self._decoder is None:
            from .codecs import Decoder

            self._decoder = Decoder(self.decode, allow_pickle=self.allow_pickle)
        return self._decoder

    def make_encoder(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if self._encoder is None:
            from .codecs import Encoder

            self._encoder = Encoder(**self.encode)
        return self._encoder

    # -- running -------------------------------------------------------------------------------
    def prepare(self, *, force: bool = False) -> RunDir:
        """Write the plan and the pickled job to the run directory (once); returns it."""
        self.make_decoder()
        self.make_encoder()
        run_dir = self.rundir()
        run_dir.remove_stale_temps()  # a driver killed mid-write of a marker leaves one behind
        run_dir.init_plan({"job": self.describe(), "tasks": [t.to_json() for t in self.plan()],
                           "settings": self.settings()}, force=force)
        run_dir.save_job(self)
        return run_dir

    def run(self, backend: str = "processes", **options: Any):
        """Run the pending tasks on a backend ("serial", "processes", "dask"); returns a RunReport."""
        from .backends import run_job

        return run_job(self, backend, **options)

    def to_kubernetes(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of a Kubernetes Indexed Job running this job; writes the plan first unless prepare=False.

        Options: parallelism, tasks_per_pod, cpu, memory, secrets, env, namespace, name, ... (see
        shardflow.manifests.ClusterOptions and docs/kubernetes.md).
        """
        from .manifests import render

        return render(self, "kubernetes", image, prepare=prepare, **options)

    def to_argo(self, image: str, *, prepare: bool = True, **options: Any) -> str:
        """YAML of an Argo Workflow running this job (same options as to_kubernetes)."""
        from .manifests import render

        return render(self, "argo", image, prepare=prepare, **options)


def _first(spec: str | Sequence[str]) -> str:
    return spec if isinstance(spec, str) else (spec[0] if spec else "")
