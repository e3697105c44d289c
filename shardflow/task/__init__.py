"""One task: `run_task` and what it needs (processing, batching, failures, seeds, devices, threads)."""
