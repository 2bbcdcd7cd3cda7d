"""The TrainJob operator (kopf): reconciles TrainJobs into Pods, Services and status."""
