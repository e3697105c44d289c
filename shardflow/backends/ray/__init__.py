"""Ray backend: `run_task(task, job)` as Ray tasks, surviving the loss of workers and nodes.

    job.run("ray", address="auto")                  # the cluster this machine belongs to (ray start, KubeRay)
    job.run("ray", address="ray://head:10001")       # Ray Client
    job.run("ray")                                   # the Ray this process joined, else a local Ray (stopped after)

How it works (docs/ray.md has the user's view):

- Tasks, not actors. Each shardflow task (or a group of tiny ones: backends.groups) is one Ray task
  with num_cpus/num_gpus/memory from the job (resources.py). Ray reuses a job's worker processes for
  its tasks (max_calls=0, also for GPU tasks, where Ray's default is 1), so the job, `ray.put` once,
  is unpickled once per worker process (on_worker.py keeps it keyed by its object ref) and a class fn
  or a job file's setup() runs once per worker process, as on the other backends. Tasks keep what Ray
  users expect of a map over files: any node with a free slot takes the next one, autoscaling sees
  the queue, and a task whose worker process or node dies is rerun by Ray (max_retries), which an
  actor pool would need restart bookkeeping for. run_task is idempotent and its outputs atomic, so
  a rerun publishes each output exactly once.
- Failures: a task failing with the transient kind (`io`) raises TransientFailure at the end of its
  Ray task, the one exception in retry_exceptions, so Ray retries it; bad input (`input`) comes back
  as a failed result, never retried; a user bug (`user`) ends the run, and the driver cancels the
  rest. A worker that keeps dying fails its task with kind `io` once Ray's retries are spent; a group
  whose worker died is split, each task retried alone.
- At most `max_in_flight` Ray tasks are submitted at once, in plan order, topped up as results come.
- Progress: workers send sample counts to a CPU-less actor (submit.ProgressSink) every 0.2 s, which
  the driver reads every 0.5 s; the report is run_job's, as everywhere.
- Closing the generator (Ctrl-C, the end of the run) cancels the Ray tasks in flight: a running one
  gets KeyboardInterrupt and aborts its temp outputs.
- Paths: tasks and the run directory are made absolute (backends/paths.py), and on a cluster given by
  address each live node checks once that it sees the run directory and the inputs (connect.preflight,
  backends/preflight.py).
"""

from shardflow.backends.ray.run import execute_ray

__all__ = ["execute_ray"]
