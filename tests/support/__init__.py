"""What every test tier and every benchmark shares: free ports, waits with a deadline, child
processes with a log, and the manifests and Pod statuses tests and benchmarks write."""
