"""Local mode: `trainjob run -f job.yaml` runs a TrainJob as processes on this machine.

Pure (no I/O; import-linter keeps them away from processes):

- :mod:`trainjob.local.plan`: ports, commands, environment and paths of every replica.
- :mod:`trainjob.local.events`: replicas' progress events folded into their latest numbers.
- :mod:`trainjob.local.logfilter`: replica output made terminal-safe, TensorFlow's noise hidden.
- :mod:`trainjob.local.view`: log prefixes, progress lines, the live table and the summary,
  drawn from snapshots of job/replica/progress states whatever their source.
- :mod:`trainjob.local.outcome`: how a run ended: final state, exit code, status after a stop.
- :mod:`trainjob.local.runs`: `trainjob status` tables from a run directory's files.

With side effects:

- :mod:`trainjob.local.executor`: subprocesses, signals, clock, terminal and run-dir files; it
  feeds observed processes to the same policy engine the operator uses.
- :mod:`trainjob.local.cli`: the run/status/logs commands: checks made up front, and wiring.
"""
