"""The program every pod of a Live Migrator job runs: `python -m trainer`."""
