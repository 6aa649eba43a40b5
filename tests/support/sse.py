"""Parse a server-sent-event body (as the adapter writes it) for assertions in tests."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """(event name or None, decoded data) per event; comment lines (keepalives) are skipped."""
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith(":"):
                continue
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            raw = "\n".join(data)
            events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return events
