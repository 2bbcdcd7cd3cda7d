"""Integration tier: the real kube-apiserver from tests/controlplane."""
