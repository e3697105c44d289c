"""Layer 1 — URL <-> bytes: storage options, shard specs, a scheme table for opening URLs, pipes,
retries, ranged remote reads, uploads and the one atomic temp-name convention. Nothing of tar here.

Modules load on first use (fsspec is not imported by `import shardflow.storage`).
"""
