"""The run directory: its layout (every file name in it), the plan, markers, summaries, the lease,
reports and status. Low enough that the reader finds summary.json through it too."""
