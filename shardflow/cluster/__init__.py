"""Layer 4 — running a planned job on a cluster: the contract pods and manifests agree on (exit
codes, index env, chunks), `shardflow worker`, and the Kubernetes/Argo manifest generators."""
