"""Shared rich consoles: results to stdout, diagnostics to stderr."""

from __future__ import annotations

from rich.console import Console

out = Console()
err = Console(stderr=True)

# Exit codes that mean something to a script driving `lego`.
EXIT_OK = 0
EXIT_FAILED = 1
"""The command ran, and its verdict is negative (a failed check, no rewarded sample)."""
EXIT_USAGE = 2
"""Bad usage or configuration: nothing was run."""
EXIT_INFRA = 3
"""Infrastructure failure: a sandbox, engine or remote host did not answer."""
