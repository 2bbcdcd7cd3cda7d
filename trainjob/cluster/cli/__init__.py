"""The cluster commands of `trainjob` (submit, attach, get, describe, wait, delete, logs
--cluster, tensorboard --cluster), with kubectl's conventions (--kubeconfig, --context,
-n/--namespace from the context, -A, -o wide|json|yaml). A job is a TrainJob (`mnist`) or a
Kubeflow TFJob that the TrainJob operator serves (`tfjob/mnist`, read as its view:
`trainjob.cluster.objects.tfjob_view`). `trainjob.cli` adds their parsers and calls their
handlers, module by module:

- `common`: what every verb shares: the cluster flags, the connection (`connected`, which turns
  a `ClusterError` into a one-line `CliError`) and the lazy import of the API modules;
- `submit`: submit (with `--code`), attach, and `follow` (the live table and summary of
  `trainjob run`, from the job's status);
- `jobs`: get, describe, wait, delete;
- `logs`: `trainjob logs` for a cluster job (read or followed, TensorFlow's noise filtered);
- `tensorboard`: `trainjob tensorboard` for a cluster job (a short-lived Pod, a port-forward).

Every API call goes through `trainjob.cluster.api` and `trainjob.cluster.api_pods`.
"""
