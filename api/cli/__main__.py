"""`python -m api.cli`: the `migrator` command."""

from api.cli.commands import main

main()
