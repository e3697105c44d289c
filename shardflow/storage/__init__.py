"""Layer 1 — URL <-> bytes: storage options, shard specs, ONE record per protocol (protocols.py),
opening URLs, pipes, retries, ranged remote reads, uploads, atomic publication and the one temp-name
convention. Nothing of tar here.

Modules load on first use (fsspec is not imported by `import shardflow.storage`).
"""
