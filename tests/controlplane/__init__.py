"""The test bed: a real Kubernetes control plane (cluster.py), the real node of this machine
(node.py), the e2e tier's cluster (e2e_cluster.py), Kueue and the gang scheduler; see README.md."""
