"""Layer 3 — one job: ShardJob and its plan, Task/TaskResult, run_task (the one path all data
takes), seeds, the run directory, stats, reports and status, job files."""
