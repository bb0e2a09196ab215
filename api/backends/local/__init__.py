"""The local backend: a supervisor process per job runs its pods on this machine."""
