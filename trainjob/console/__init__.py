"""The console: how a TrainJob looks on the terminal, the same for a local run (`trainjob run`)
and a cluster job (`trainjob submit --follow`, `logs`, `get`, `describe`).

Pure (they take snapshots of job/replica/progress states whatever their source; import-linter
keeps them away from processes, clocks and the API server):

- :mod:`trainjob.console.replica_progress`: replicas' progress events folded into their latest
  numbers.
- :mod:`trainjob.console.logfilter`: replica output made terminal-safe, TensorFlow's noise
  hidden.
- :mod:`trainjob.console.view`: log prefixes, progress lines, the live table and the summary.
- :mod:`trainjob.console.outcome`: how a run ended: final state, exit code, status after a stop.

With side effects:

- :mod:`trainjob.console.terminal`: log lines and the live table on the output stream.
"""
