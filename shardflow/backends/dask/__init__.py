"""Dask backend: `run_task(task, job)` on a Dask cluster, surviving the loss of workers.

    job.run("dask", address="tcp://scheduler:8786")   # an existing cluster
    job.run("dask", client=client)                     # an existing distributed.Client (KubeCluster, SLURMCluster...)
    job.run("dask")                                    # a LocalCluster: one worker process per core

How it works (docs/dask.md has the user's view):

- The job is cloudpickled once and stored on the scheduler once (a dask Variable, so it outlives
  any worker); each worker fetches and unpickles it on its first task and keeps it for the run.
  Tasks carry only a Task value (ids and URLs) and have no dependencies, so the scheduler queues
  them and hands them out in plan order as worker threads free up.
- Only pending task ids are submitted (run_job already skipped the finished ones), in at most
  `max_in_flight` Dask tasks at a time (default 3 x the cluster's threads), topped up as results
  come back, so 100,000 tasks never sit in the scheduler at once. Each result is released as soon
  as it is read (submit.py).
- Tiny tasks go several per Dask task (`tasks_per_call`, automatic by default: backends.groups),
  so the scheduler's ~5 ms per Dask task is paid once per group; each still runs through run_task
  alone and is recorded and reported alone. A group whose workers keep dying is split: each of its
  unfinished tasks is retried alone, so only the culprit fails.
- Workers stream sample counts to the client through Dask's event topics (`Worker.log_event`), so
  the progress bar moves while long tasks run.
- A worker killed mid-task: the scheduler reruns its task elsewhere; run_task is idempotent and its
  outputs atomic, so each task's outputs are published exactly once. A task whose workers keep dying
  (`distributed.scheduler.allowed-failures`) comes back as KilledWorker: reported failed, kind "io".
- The scheduler lost: the run ends with JobError; the run directory keeps every finished task, so
  rerunning the same command resumes.
- Closing the generator (Ctrl-C, on_error="raise") cancels outstanding tasks; a task already
  running notices within about half a second (it checks its state at each progress report), aborts
  its temp outputs and returns.
"""

from shardflow.backends.dask.client import execute_dask

__all__ = ["execute_dask"]
