"""What runs agents: the rank process, a local cluster of them, the workload that drives it."""
