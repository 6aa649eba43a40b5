"""Shared rich consoles: results to stdout, diagnostics to stderr.

Rich reads ``[word]`` as markup and drops it, so text that we did not write ourselves (error messages,
config values, task ids, paths) must never be interpolated into a markup string raw: `[rollout]` in an
error, `lego-rl[e2b]` in a hint or a value containing `[bold]` would vanish or restyle the output. Route
such text through ``fail`` (diagnostic lines) or ``escape``/``Text`` (table cells, progress descriptions).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from rich.console import Console
from rich.markup import escape
from rich.text import Text

NO_WRAP_WIDTH = 100_000
"""Width of a console that is no terminal: a log or a pipe has no columns to fit, and rich's default of 80
would fold every long line and table there (``COLUMNS`` set by the operator still wins)."""


def _console(**kwargs: object) -> Console:
    console = Console(**kwargs)  # type: ignore[arg-type]
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = NO_WRAP_WIDTH
    return console


out = _console()
err = _console(stderr=True)

# Exit codes that mean something to a script driving `lego`.
EXIT_OK = 0
EXIT_FAILED = 1
"""The command ran, and its verdict is negative (a failed check, no rewarded sample)."""
EXIT_USAGE = 2
"""Bad usage or configuration: nothing was run."""
EXIT_INFRA = 3
"""Infrastructure failure: a sandbox, engine or remote host did not answer."""

__all__ = ["EXIT_FAILED", "EXIT_INFRA", "EXIT_OK", "EXIT_USAGE", "err", "escape", "fail", "out", "quiet_foreign_progress"]


def fail(message: object, *, label: str = "error") -> None:
    """Print one diagnostic line, ``label:`` in bold red, then ``message`` as literal text."""
    err.print(Text.assemble((f"{label}:", "bold red"), " ", str(message)), highlight=False)


FOREIGN_BARS_OFF = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
"""Environment that turns off the tqdm bars of Hugging Face (hub downloads, transformers' "Loading checkpoint
shards") and of tqdm itself, in this process and in the processes it starts (engine, trainer ranks)."""


def quiet_foreign_progress(environ: MutableMapping[str, str] | None = None, *, terminal: bool | None = None) -> bool:
    """When stderr is no terminal (a log file, a pipe), switch off other libraries' progress bars: they redraw
    with carriage returns, which a log keeps as one garbled line. An operator's own setting wins. True if it
    switched them off."""
    if err.is_terminal if terminal is None else terminal:
        return False
    env = os.environ if environ is None else environ
    for key, value in FOREIGN_BARS_OFF.items():
        env.setdefault(key, value)
    return True
