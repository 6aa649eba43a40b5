"""``Finding``: one result of a ``lego validate`` check (the checks and the dataset scan both make them).

A finding's message quotes the values involved; ``fix`` names the key (or variable) to change; ``keys``
lists the config keys it is about. Errors fail ``lego validate`` (exit 1) and stop ``rollout-check``;
warnings are printed only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    fix: str
    keys: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "keys": list(self.keys)}


def error(code: str, message: str, fix: str, *keys: str) -> Finding:
    return Finding(code, "error", message, fix, keys)


def warning(code: str, message: str, fix: str, *keys: str) -> Finding:
    return Finding(code, "warning", message, fix, keys)
