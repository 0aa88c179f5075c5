"""The `goodput` command line: main.py parses and dispatches; one module per group of commands."""

from services.cli.main import main

__all__ = ["main"]
