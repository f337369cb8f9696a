"""The command line: ``main`` mounts one module per command group; ``common`` holds the shared
options, parsers, the console, tables and progress bars. No command module imports another."""

from wispsim.cli.main import app, main

__all__ = ["app", "main"]
