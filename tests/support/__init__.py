"""What every test tier and every benchmark share, knowing nothing of the test bed or the tiers:
free ports, waits with a deadline, logged child processes (the operator among them), and the
TrainJob manifests and Pod statuses that tests and benchmarks write."""
