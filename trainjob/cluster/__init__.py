"""TrainJobs on a cluster from the user's side: the `trainjob` cluster commands (`cli/`, one
module per verb group) and the Python client. `api` and `api_pods` (Pods of one's own,
port-forwards) are the only modules that talk to the API server (import-linter keeps it so);
`show` turns what they return into text, tables and the live view's `Snapshot`, purely."""
