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



def check_patch_structure(patch: str, *, what: str = "test patch") -> None:
    """Raise ``TaskDataError`` unless ``patch`` is a well-formed unified diff (an empty one is fine).

    Caught, each with the patch line it is on: text with no file header at all; a ``---`` header not
    followed by ``+++``; a hunk before any file header; plain file headers with no hunk anywhere; a hunk
    whose body holds fewer lines than its ``@@ -a,b +c,d @@`` header counts (git: "corrupt patch") or
    more (git would stop at the count and skip the rest as garbage, so the patch would apply something
    else than it shows). Text before the first header (a commit message) and after a ``-- `` signature
    line is ignored, and a ``diff --git`` section may carry no hunk (a mode change, a rename, an empty
    file), as git allows.
    """
    if not patch.strip():
        return
    lines = patch.splitlines()
    n = len(lines)
    files = hunks = git_sections = 0
    section: str | None = None  # the file whose section we are in
    git_section = header_seen = binary = False

    def at(k: int) -> str:
        return f"{what} line {k + 1}" if k < n else f"the end of the {what}"

    i = 0
    while i < n:
        line = lines[i]
        if line == "-- " and files:
            break  # format-patch signature: the rest is not part of the diff
        if line.startswith("diff --git "):
            m = _DIFF_GIT.match(line)
            files, git_sections = files + 1, git_sections + 1
            section = _strip_prefix(_unquote(m["b"]) if m else line[11:])
            git_section, header_seen, binary = True, False, False
            i += 1
            continue
        if binary:  # base85 data until the next file
            i += 1
            continue
        if line.startswith("--- "):
            if i + 1 >= n or not lines[i + 1].startswith("+++ "):
                raise TaskDataError(f"{at(i)}: '---' file header is not followed by a '+++' header")
            if not (git_section and not header_seen):  # a plain diff's file (no 'diff --git' above it)
                files, git_section = files + 1, False
            names = [_HEADER.match(h) for h in (lines[i + 1], line)]  # +++ names the file, --- a deleted one
            paths = [_strip_prefix(_unquote(m["p"].rstrip())) for m in names if m]
            section, header_seen = next((p for p in paths if p), "/dev/null"), True
            i += 2
            continue
        if git_section and line.startswith("GIT binary patch"):
            binary = True
            i += 1
            continue
        hunk = _HUNK.match(line)
        if hunk is None:
            i += 1  # index and mode lines, a preamble, blank lines between files: ignored, as git does
            continue
        label = line.split(" @@")[0] + " @@"
        if section is None:
            raise TaskDataError(f"{at(i)}: hunk {label} comes before any file header")
        old = int(hunk["ol"]) if hunk["ol"] is not None else 1
        new = int(hunk["nl"]) if hunk["nl"] is not None else 1
        start, i, hunks = i, i + 1, hunks + 1
        while old > 0 or new > 0:
            tag = lines[i][:1] if i < n else None
            if tag in (" ", "") and old > 0 and new > 0:
                old, new = old - 1, new - 1
            elif tag == "-" and old > 0:
                old -= 1
            elif tag == "+" and new > 0:
                new -= 1
            elif tag != "\\":
                raise TaskDataError(f"{at(start)}: hunk {label} of {section!r} is short: {old} old and {new} new "
                                    f"lines still owed at {at(i)}")
            i += 1
        while i < n and lines[i].startswith("\\"):
            i += 1  # "\ No newline at end of file" after the hunk's last line
        stray = lines[i] if i < n else ""
        if stray[:1] in ("+", "-", " ") and stray != "-- " and not (
            stray.startswith("--- ") and i + 1 < n and lines[i + 1].startswith("+++ ")
        ):
            raise TaskDataError(f"{at(i)}: a {stray[:1]!r} line after the end of hunk {label} of {section!r}: "
                                "the header's line counts are too small")
    if not files:
        first = next((ln for ln in lines if ln.strip()), "")
        raise TaskDataError(f"{what} is not a unified diff: no 'diff --git' or '---'/'+++' file header "
                            f"(it starts with {first[:60]!r})")
    if not hunks and not git_sections:
        raise TaskDataError(f"{what} has file headers but no hunk: it changes nothing")
