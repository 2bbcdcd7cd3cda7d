"""Local mode: `trainjob run -f job.yaml` runs a TrainJob as processes on this machine.

- :mod:`trainjob.local.plan` (pure): ports, commands, environment and paths of every replica.
- :mod:`trainjob.local.display` (pure): progress folding, the live table, log prefixes, summary.
- :mod:`trainjob.local.executor`: the one module with side effects (subprocesses, signals,
  clock); it feeds observed processes to the same policy engine the operator uses.
- :mod:`trainjob.local.cli`: argument parsing and wiring.
"""
