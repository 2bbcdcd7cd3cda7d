"""TrainJob: TensorFlow multi-worker training as a Kubernetes custom resource, or locally."""

__version__ = "0.1.0"
