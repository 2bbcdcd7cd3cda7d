"""The real Kubernetes control plane used by tests/integration (see cluster.py)."""
