"""Shared rich consoles: results to stdout, diagnostics to stderr.

Rich reads ``[word]`` as markup and drops it, so text that we did not write ourselves (error messages,
config values, task ids, paths) must never be interpolated into a markup string raw: `[rollout]` in an
error, `lego-rl[e2b]` in a hint or a value containing `[bold]` would vanish or restyle the output. Route
such text through ``fail`` (diagnostic lines) or ``escape``/``Text`` (table cells, progress descriptions).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text

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

__all__ = ["EXIT_FAILED", "EXIT_INFRA", "EXIT_OK", "EXIT_USAGE", "err", "escape", "fail", "out"]


def fail(message: object, *, label: str = "error") -> None:
    """Print one diagnostic line, ``label:`` in bold red, then ``message`` as literal text."""
    err.print(Text.assemble((f"{label}:", "bold red"), " ", str(message)), highlight=False)
