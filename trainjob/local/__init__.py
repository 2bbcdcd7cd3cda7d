"""Local mode: `trainjob run -f job.yaml` runs a TrainJob as processes on this machine.

What the run looks like on the terminal (log prefixes, the live table, the summary) is
:mod:`trainjob.console`, shared with the cluster commands.

Pure (no I/O; import-linter keeps them away from processes):

- :mod:`trainjob.local.plan`: ports, commands, environment and paths of every replica.
- :mod:`trainjob.local.runs`: `trainjob status` tables from a run directory's files.
- :mod:`trainjob.local.usernet`: the run network's way out (pasta's command line) and the
  hint a replica that failed connecting out gets.

With side effects:

- :mod:`trainjob.local.supervisor`: the replicas' processes (start, poll, stop, signals).
- :mod:`trainjob.local.netns`: the run's own network, which nothing outside reaches
  (TensorFlow's servers listen on every interface): made by a holder process, joined by every
  replica; its way out through pasta is decided in :mod:`trainjob.local.usernet` (pure).
- :mod:`trainjob.local.rundir`: the run directory: lock, status.json, processes.json, logs.
- :mod:`trainjob.local.data`: the shared data dir and the offline MNIST prepared once.
- :mod:`trainjob.local.executor`: the loop wiring them: observed processes go to the same
  policy engine the operator uses, its decisions back to the supervisor.
- :mod:`trainjob.local.cli`: the run/status/logs commands: checks made up front, and wiring.
"""
