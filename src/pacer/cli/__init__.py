"""The `pacer` command line: the subcommand table (`main`), `pacer generate` and `pacer serve`."""

from pacer.cli.main import SUBCOMMANDS, main

__all__ = ["main", "SUBCOMMANDS"]
