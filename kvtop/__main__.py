"""`python -m kvtop` is the `kvtop` command."""

from kvtop.cli.entry import main

main()
