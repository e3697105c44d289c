"""Helpers for the cluster tests (no tests here): shards, a job file, and local pod runners.

`run_indexed_job` plays the Kubernetes Job controller for a generated Indexed Job: it starts each
index's container command (the image's `shardflow` replaced by this environment's) with the
manifest's env and JOB_COMPLETION_INDEX, `parallelism` pods at a time, and applies podFailurePolicy,
backoffLimitPerIndex and maxFailedIndexes as Kubernetes does (simplified). `run_workflow` does the same
for a generated Argo Workflow (steps, withSequence, parallelism, retryStrategy, continueOn).
A test can kill a pod mid-task (SIGKILL: a crash; SIGTERM with a disruption: an eviction).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from shardflow.shards.samples import read_samples
from shardflow.shards.writer import TarWriter
from tests.support.k8s_expansion import container_env, expand

JOB_FILE = '''"""identity: copies each sample (optionally slowly, to be killed mid-task)."""
import time

PARAMS = dict(sleep=0.0)


def process(sample):
    if PARAMS["sleep"]:
        time.sleep(PARAMS["sleep"])
    return {k: v for k, v in sample.items() if k != "__url__"}
'''


def write_job_file(folder: Path) -> Path:
    path = folder / "identity.py"
    path.write_text(JOB_FILE)
    return path


def make_shards(folder: Path, shards: int, per_shard: int, *, truncate: int | None = None) -> list[str]:
    """`in-000000.tar`... with txt samples keyed `s{shard}/k{i}`; shard `truncate` is cut mid-member."""
    folder.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(shards):
        path = folder / f"in-{s:06d}.tar"
        with TarWriter(str(path)) as writer:
            for i in range(per_shard):
                writer.write({"__key__": f"s{s}/k{i:03d}", "txt": f"sample {s} {i} ".encode() * 50})
        if s == truncate:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2 + 100])
        urls.append(str(path))
    return urls


def input_keys(shards: int, per_shard: int, skip: set[int] = frozenset()) -> list[str]:
    return sorted(f"s{s}/k{i:03d}" for s in range(shards) if s not in skip for i in range(per_shard))


def output_keys(folder: Path) -> list[str]:
    """Every sample key in the final (non-hidden) tar files of `folder`, duplicates kept."""
    keys = []
    for path in sorted(folder.glob("*.tar")):
        keys += [s["__key__"] for s in read_samples(str(path))]
    return sorted(keys)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def shardflow_command() -> list[str]:
    """This environment's `shardflow` (what the image's entrypoint is in a pod)."""
    exe = Path(sys.executable).with_name("shardflow")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from shardflow.cli import main; main()"]


def pod_argv(container: dict[str, Any], substitute: Callable[[str], str] = lambda s: s) -> list[str]:
    command = list(container.get("command") or ["shardflow"])
    assert command[0] == "shardflow", command
    defined = container_env(container)  # the kubelet expands $(VAR) in args (k8s_expansion.py)
    return shardflow_command() + [expand(substitute(a), defined) for a in command[1:] + list(container.get("args", []))]


def pod_env(container: dict[str, Any], tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The manifest's env (secretRef values are the test's business), plus what a process needs here."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for name in ("PYTHONPATH", "LANG", "SYSTEMROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(container_env(container))  # each value expanded as the kubelet does (k8s_expansion.py)
    if env.get("HOME") == "/tmp":  # the pod's emptyDir at /tmp: a private folder here
        env["HOME"] = str(tmp)
    env.update(extra or {})
    return env


def exit_status(returncode: int) -> int:
    """A container's exit code as Kubernetes reports it (128 + signal for a killed process)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Pod:
    index: int
    attempt: int
    proc: subprocess.Popen
    log: Path
    disrupted: bool = False  # killed by an "eviction": the pod gets the DisruptionTarget condition


@dataclass
class Kill:
    """Kill the first attempt of `index` once `ready()` is true (e.g. a temp output exists)."""

    index: int
    ready: Callable[[], bool]
    sig: int = signal.SIGKILL
    disruption: bool = False
    attempt: int = 0
    seen: dict[str, Any] = field(default_factory=dict)  # filled when it fired: what the folder looked like


@dataclass
class JobRun:
    succeeded: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    attempts: dict[int, list[int]] = field(default_factory=dict)  # index -> exit codes, in order
    ignored: int = 0  # pod failures the policy ignored (disruptions)
    failed_job: str | None = None  # the reason the Job failed, if it did
    logs: dict[tuple[int, int], str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.failed_job is None and not self.failed


def _match_rule(rule: dict[str, Any], code: int, disrupted: bool) -> bool:
    if "onPodConditions" in rule:
        return any(c["type"] == "DisruptionTarget" and c.get("status", "True") == "True" and disrupted
                   for c in rule["onPodConditions"])
    on = rule["onExitCodes"]
    if on["operator"] == "In":
        return code in on["values"]
    assert on["operator"] == "NotIn"
    return code not in on["values"] and code != 0


def _wait_any(pods: list[Pod], kills: list[Kill], timeout: float) -> Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in pods:
            for kill in kills:
                if kill.index == pod.index and kill.attempt == pod.attempt and not kill.seen and kill.ready():
                    kill.seen["fired"] = True
                    pod.disrupted = kill.disruption
                    pod.proc.send_signal(kill.sig)
            if pod.proc.poll() is not None:
                return pod
        time.sleep(0.01)
    for pod in pods:
        pod.proc.kill()
    raise TimeoutError(f"pods {[p.index for p in pods]} still running after {timeout} s")


def _start(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


def run_indexed_job(manifest: dict[str, Any], tmp: Path, *, kills: list[Kill] = (), env: dict[str, str] | None = None,
                    on_exit: Callable[[Pod, int], None] | None = None, timeout: float = 120) -> JobRun:
    """Run a batch/v1 Indexed Job's pods locally, as the Job controller would (simplified)."""
    spec = manifest["spec"]
    assert spec["completionMode"] == "Indexed"
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    (container,) = pod_spec["containers"]
    completions, parallelism = spec["completions"], spec["parallelism"]
    backoff, max_failed = spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    run = JobRun()
    pending = list(range(completions))  # indexes waiting for a pod, in order
    failures = {i: 0 for i in range(completions)}
    attempt_no = {i: 0 for i in range(completions)}
    running: list[Pod] = []
    argv = pod_argv(container)
    while (pending or running) and run.failed_job is None:
        while pending and len(running) < parallelism:
            index = pending.pop(0)
            tmpdir = tmp / f"pod-{index}-{attempt_no[index]}"
            tmpdir.mkdir(parents=True)
            log = tmpdir / "log.txt"
            pod_env_ = pod_env(container, tmpdir, {**(env or {}), "JOB_COMPLETION_INDEX": str(index)})
            running.append(Pod(index, attempt_no[index], _start(argv, pod_env_, tmpdir, log), log))
        pod = _wait_any(running, list(kills), timeout)
        running.remove(pod)
        code = exit_status(pod.proc.returncode)
        run.attempts.setdefault(pod.index, []).append(code)
        run.logs[(pod.index, pod.attempt)] = pod.log.read_text(errors="replace")
        if on_exit is not None:
            on_exit(pod, code)
        attempt_no[pod.index] += 1
        if code == 0:
            run.succeeded.add(pod.index)
            continue
        action = next((r["action"] for r in rules if _match_rule(r, code, pod.disrupted)), "Count")
        if action == "Ignore":
            run.ignored += 1
            pending.insert(0, pod.index)
        elif action == "FailJob":
            run.failed_job = f"PodFailurePolicy: index {pod.index} exited {code}"
        elif action == "FailIndex":
            run.failed.add(pod.index)
        else:
            assert action == "Count", action
            failures[pod.index] += 1
            if failures[pod.index] > backoff:
                run.failed.add(pod.index)
            else:
                pending.insert(0, pod.index)
        if len(run.failed) > max_failed:
            run.failed_job = f"MaxFailedIndexesExceeded: {sorted(run.failed)}"
    for pod in running:  # the Job failed: Kubernetes deletes the remaining pods
        pod.proc.kill()
        pod.proc.wait()
    return run


# -- Argo -----------------------------------------------------------------------------------------
def argo_expression(expression: str, status: str, exit_code: str) -> bool:
    """Evaluate the small subset of Argo's expr language our retry expressions use."""
    text = expression.replace("||", " or ").replace("&&", " and ")
    text = re.sub(r"!\s*\(", " not (", text)
    text = text.replace("asInt(", "int(")
    return bool(eval(text, {"__builtins__": {"int": int}},  # noqa: S307 - our own generated expression
                     {"lastRetry": _LastRetry(status, exit_code)}))


@dataclass
class _LastRetry:
    status: str
    exitCode: str  # noqa: N815 - Argo's name


@dataclass
class StepRun:
    template: str
    item: str | None
    exit_codes: list[int] = field(default_factory=list)
    phase: str = "Pending"  # Succeeded | Failed
    logs: list[str] = field(default_factory=list)


def _fill(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\{\{([^}]+)\}\}", lambda m: values[m.group(1).strip()], text)


def run_workflow(workflow: dict[str, Any], tmp: Path, *, kills: list[Kill] = (), env: dict[str, str] | None = None,
                 timeout: float = 120) -> tuple[str, list[StepRun]]:
    """Run an Argo Workflow's steps locally; returns (workflow phase, step runs)."""
    spec = workflow["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    main = templates[spec["entrypoint"]]
    all_runs: list[StepRun] = []
    for group in main["steps"]:
        for step in group:
            items: list[str | None] = [None]
            if "withSequence" in step:
                items = [str(i) for i in range(int(step["withSequence"]["count"]))]
            runs = [StepRun(step["template"], item) for item in items]
            _run_items(templates[step["template"]], step, runs, main.get("parallelism") or len(runs), tmp,
                       list(kills), env or {}, timeout)
            all_runs += runs
            if any(r.phase == "Failed" for r in runs) and not step.get("continueOn", {}).get("failed"):
                return "Failed", all_runs
    return "Succeeded", all_runs


def _run_items(template: dict[str, Any], step: dict[str, Any], runs: list[StepRun], parallelism: int, tmp: Path,
               kills: list[Kill], env: dict[str, str], timeout: float) -> None:
    container = template["container"]
    strategy = template.get("retryStrategy", {})
    limit = int(strategy.get("limit", 0))
    queue = list(range(len(runs)))
    running: dict[int, tuple[Pod, StepRun]] = {}
    while queue or running:
        while queue and len(running) < parallelism:
            n = queue.pop(0)
            run = runs[n]
            values = {"item": run.item or ""}
            params = {p["name"]: _fill(str(p["value"]), values)
                      for p in step.get("arguments", {}).get("parameters", [])}
            inputs = {f"inputs.parameters.{k}": v for k, v in params.items()}
            argv = pod_argv(container, lambda s, inputs=inputs: _fill(s, inputs))
            attempt = len(run.exit_codes)
            tmpdir = tmp / f"{template['name']}-{run.item}-{attempt}"
            tmpdir.mkdir(parents=True)
            index = int(run.item) if run.item is not None else -1
            pod = Pod(index, attempt, _start(argv, pod_env(container, tmpdir, env), tmpdir, tmpdir / "log.txt"),
                      tmpdir / "log.txt")
            running[id(pod)] = (pod, run)
        pod = _wait_any([p for p, _ in running.values()], kills, timeout)
        _, run = running.pop(id(pod))
        code = exit_status(pod.proc.returncode)
        run.exit_codes.append(code)
        run.logs.append(pod.log.read_text(errors="replace"))
        if code == 0:
            run.phase = "Succeeded"
            continue
        status = "Error" if pod.disrupted else "Failed"
        policy_applies = strategy.get("retryPolicy") in ("Always", "OnFailure" if status == "Failed" else "OnError")
        if len(run.exit_codes) <= limit and policy_applies \
                and argo_expression(strategy.get("expression", "true"), status, str(code)):
            queue.insert(0, runs.index(run))  # backoff not simulated
        else:
            run.phase = "Failed"


def copy_tree_without(src: Path, dst: Path, ignore: Callable[[str], bool]) -> None:
    for path in src.rglob("*"):
        rel = path.relative_to(src).as_posix()
        if path.is_file() and not ignore(rel):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / rel)


def glob_temps(folder: Path, names: str = "*") -> Callable[[], bool]:
    """A Kill.ready: true once a writer's temp file of an output called `names` (a glob) exists."""
    return lambda: bool(glob.glob(str(folder / f".{names}.tmp-*")))
