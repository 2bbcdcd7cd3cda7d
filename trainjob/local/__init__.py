"""Local mode: `trainjob run -f job.yaml` runs a TrainJob as processes on this machine.

Pure (no I/O; import-linter keeps them away from processes):

- :mod:`trainjob.local.plan`: ports, commands, environment and paths of every replica.
- :mod:`trainjob.local.replica_progress`: replicas' progress events folded into their latest
  numbers.
- :mod:`trainjob.local.logfilter`: replica output made terminal-safe, TensorFlow's noise hidden.
- :mod:`trainjob.local.view`: log prefixes, progress lines, the live table and the summary,
  drawn from snapshots of job/replica/progress states whatever their source.
- :mod:`trainjob.local.outcome`: how a run ended: final state, exit code, status after a stop.
- :mod:`trainjob.local.runs`: `trainjob status` tables from a run directory's files.

With side effects:

- :mod:`trainjob.local.supervisor`: the replicas' processes (start, poll, stop, signals).
- :mod:`trainjob.local.netns`: the run's own network, loopback only (TensorFlow's servers
  listen on every interface): made by a holder process, joined by every replica.
- :mod:`trainjob.local.rundir`: the run directory: lock, status.json, processes.json, logs.
- :mod:`trainjob.local.terminal`: log lines and the live table on the output stream.
- :mod:`trainjob.local.data`: the shared data dir and the offline MNIST prepared once.
- :mod:`trainjob.local.executor`: the loop wiring them: observed processes go to the same
  policy engine the operator uses, its decisions back to the supervisor.
- :mod:`trainjob.local.cli`: the run/status/logs commands: checks made up front, and wiring.
"""
