"""The command line face: argparse commands and text/JSON printers."""

from tui.cli.main import main

__all__ = ["main"]
