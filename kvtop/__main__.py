"""`python -m kvtop` is the `kvtop` command."""

from kvtop.cli.app import main

main()
