"""The control plane's clients, apart from the server: the `migrator` CLI, the demo, and what they
share (the API client, following a job, printing safely to a terminal)."""
