"""TrainJobs on a cluster from the user's side: the `trainjob` cluster commands and the Python
client. `api` is the only module that talks to the API server (import-linter keeps it so);
`show` turns what it returns into text, tables and the live view's `Snapshot`, purely."""
