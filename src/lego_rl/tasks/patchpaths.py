"""Paths touched by a unified diff, and the safety rule for official test patches.

The grader resets every path an official test patch touches before applying it, so a path that is
absolute or climbs out of the repository (``..``) would let a dataset row reach outside the
workspace. Such a patch is rejected as bad task data, never applied.
"""

from __future__ import annotations

import re

from lego_rl.errors import TaskDataError

_DIFF_GIT = re.compile(r'^diff --git (?P<a>"(?:[^"\\]|\\.)*"|\S+) (?P<b>"(?:[^"\\]|\\.)*"|\S+)$')
_HEADER = re.compile(r'^(?:---|\+\+\+) (?P<p>"(?:[^"\\]|\\.)*"|[^\t\n]+)')
_HUNK = re.compile(r"^@@ -\d+(?:,(?P<ol>\d+))? \+\d+(?:,(?P<nl>\d+))? @@")
_EXTENDED = re.compile(r"^(?:rename|copy) (?:from|to) (?P<p>.+)$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v"}


def _unquote(token: str) -> str:
    """Undo git's C-style quoting of a path (``"a/caf\\303\\251.py"``)."""
    if not (token.startswith('"') and token.endswith('"')):
        return token
    body = token[1:-1]
    raw = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            raw += ch.encode()
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt.isdigit():  # octal byte, three digits
            raw.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            raw += _ESCAPES.get(nxt, nxt).encode()
            i += 2
    return raw.decode("utf-8", errors="surrogateescape")


def _strip_prefix(path: str) -> str | None:
    """``a/x`` -> ``x``; ``/dev/null`` -> None."""
    if path == "/dev/null":
        return None
    if path[:2] in ("a/", "b/"):
        return path[2:]
    return path


def check_relative_path(path: str) -> str:
    """Return ``path`` when it stays inside the repository, else raise ``TaskDataError``."""
    if not path or path.startswith("/"):
        raise TaskDataError(f"test patch path {path!r} is absolute or empty; only repository-relative paths are allowed")
    if ".." in path.split("/"):
        raise TaskDataError(f"test patch path {path!r} contains '..'; only paths inside the repository are allowed")
    return path


def patch_paths(patch: str) -> list[str]:
    """Every repository path a unified diff reads or writes, in order of appearance, deduplicated.

    Understands ``diff --git`` headers (quoted or not), ``---``/``+++`` lines and rename/copy lines.
    Raises ``TaskDataError`` for an absolute path or one containing ``..``.
    """
    seen: dict[str, None] = {}
    old_left = new_left = 0  # lines still owed by the current hunk; header-looking lines inside are content
    for line in patch.splitlines():
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag in (" ", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag == "\\":
                pass  # "\ No newline at end of file"
            else:
                old_left = new_left = 0  # malformed hunk: fall through and treat as a header line
            if old_left > 0 or new_left > 0 or tag in (" ", "", "-", "+", "\\"):
                continue
        hunk = _HUNK.match(line)
        if hunk:
            old_left = int(hunk["ol"]) if hunk["ol"] is not None else 1
            new_left = int(hunk["nl"]) if hunk["nl"] is not None else 1
            continue
        if line.startswith("diff --git "):
            m = _DIFF_GIT.match(line)
            if m:
                for tok in (m["a"], m["b"]):
                    p = _strip_prefix(_unquote(tok))
                    if p is not None:
                        seen.setdefault(check_relative_path(p), None)
            continue
        m2 = _HEADER.match(line)
        if m2:
            p = _strip_prefix(_unquote(m2["p"].rstrip()))
            if p is not None:
                seen.setdefault(check_relative_path(p), None)
            continue
        m3 = _EXTENDED.match(line)
        if m3:
            seen.setdefault(check_relative_path(_unquote(m3["p"])), None)
    return list(seen)
