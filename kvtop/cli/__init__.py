"""The `kvtop` command line (Typer). Headless commands never import Textual."""
