"""``lego monitor``: the live terminal view (rich ``Live`` on the alternate screen, keys read from a cbreak
terminal) and the one-shot snapshot (``--once`` / ``--json``).

Why rich and not textual: rich is already a dependency (every command prints with it), starts in a fraction
of textual's import time (the ``--once`` budget is 2 s on a 10,000-rollout run), and the monitor needs no
widgets beyond tables and text redrawn on a timer; key handling is a few lines of termios. Each tick reads
only what the run appended (``RunState.refresh``) and builds only the section on screen.
"""

from __future__ import annotations

import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.rule import Rule
from rich.text import Text

from lego_rl.monitor import views
from lego_rl.monitor.compare import Comparison, compare
from lego_rl.monitor.drill import RolloutDetail, detail
from lego_rl.monitor.snapshot import SECTIONS, Snapshot, TurnCache, build
from lego_rl.monitor.stages import StageInfo, Stages, is_run, stage_dirs
from lego_rl.monitor.state import RunState

KEYS = {key: section for key, section, _ in views.VIEWS}
ESC = "\x1b"


class Monitor:
    """The view state (active view, selection, scroll, search) over one run, or two with ``other``."""

    def __init__(self, root: Path, *, kl_warn: float, other: Path | None = None) -> None:
        self.root = Path(root)
        self.state = self.parent_state = RunState(root)
        self.stages: Stages | None = None
        """Set when ``root`` holds no run but its sub-folders do (the main job's stages)."""
        self.stage_infos: list[StageInfo] = []
        self.stage_open: Path | None = None
        """The stage shown (None: the list of stages, when there are stages)."""
        self.other = RunState(other) if other is not None else None
        self.kl_warn = kl_warn
        self.cache = TurnCache()
        self.view = "overview"
        self.selected = 0
        self.offset = 0
        self.query: str | None = None
        self.typing: str | None = None
        """The search being typed (None when not in search mode)."""
        self.opened: RolloutDetail | None = None
        self.snap: Snapshot | None = None
        self.comparison: Comparison | None = None

    # -- data ------------------------------------------------------------------------------------------

    @property
    def listing_stages(self) -> bool:
        """The list of stages is on screen (a folder of runs, none opened)."""
        return self.stage_open is None and bool(self.stage_infos)

    def refresh_stages(self) -> None:
        """A folder holding no run of its own but runs in its sub-folders (possibly appearing later): follow
        them as stages."""
        if self.stages is None and not is_run(self.root) and stage_dirs(self.root):
            self.stages = Stages(self.root)
        if self.stages is not None:
            self.stage_infos = self.stages.refresh()

    def open_stage(self, path: Path) -> None:
        assert self.stages is not None
        self.stage_open, self.state = path, self.stages.states[path]
        self.view, self.selected, self.offset, self.opened, self.query = "overview", 0, 0, None, None

    def refresh(self, sections: tuple[str, ...] | None = None) -> Snapshot:
        """Read what the run(s) appended and rebuild the sections shown (all of them for ``--once``)."""
        now = time.time()
        self.refresh_stages()
        self.state.refresh()
        want = sections or (("rollouts",) if self.view == "compare" else (self.view,))
        self.snap = build(
            self.state, now=now, kl_warn=self.kl_warn, sections=want, cache=self.cache, query=self.query
        )
        if self.other is not None and (sections is not None or self.view == "compare"):
            self.other.refresh()
            self.comparison = compare(self.state, self.other, now)
        if self.opened is not None:  # an in-flight rollout keeps changing: reopen it
            self.opened = detail(self.state, self.opened.rollout.rollout_id) or self.opened
        return self.snap

    # -- keys ------------------------------------------------------------------------------------------

    def key(self, k: str) -> bool:
        """Apply one key; True to quit."""
        if self.typing is not None:
            if k in ("\r", "\n"):
                self.query, self.typing = (self.typing.strip() or None), None
                self.view, self.selected, self.offset = "rollouts", 0, 0
            elif k == ESC:
                self.typing = None
            elif k in ("\x7f", "\b"):
                self.typing = self.typing[:-1]
            elif k.isprintable() and len(k) == 1:
                self.typing += k
            return False
        if k in ("q", "\x03"):
            return True
        if self.opened is not None and k in (ESC, "\x7f", "\b", "h"):
            self.opened, self.offset = None, 0
            return False
        if self.listing_stages:
            if k in ("UP", "k"):
                self.selected = max(0, self.selected - 1)
            elif k in ("DOWN", "j"):
                self.selected = min(len(self.stage_infos) - 1, self.selected + 1)
            elif k in ("\r", "\n"):
                self.open_stage(Path(self.stage_infos[min(self.selected, len(self.stage_infos) - 1)].path))
            return False
        if self.stage_open is not None and k in (ESC, "\x7f", "\b"):  # back to the list of stages
            names = [i.path for i in self.stage_infos]
            self.selected = names.index(str(self.stage_open)) if str(self.stage_open) in names else 0
            self.stage_open, self.state, self.view, self.offset = None, self.parent_state, "overview", 0
            return False
        if k == "/":
            self.typing = ""
            return False
        picks = self.opened is None and self.view in ("rollouts", "terminations", "consistency")
        if k in ("UP", "k"):
            if picks:
                self.selected = max(0, self.selected - 1)
            else:
                self.offset = max(0, self.offset - 1)
            return False
        if k in ("DOWN", "j"):
            if picks:
                self.selected += 1
            else:
                self.offset += 1
            return False
        if k in ("PGDN", " "):
            self.offset += 20
            return False
        if k == "PGUP":
            self.offset = max(0, self.offset - 20)
            return False
        if k in ("\r", "\n") and self.view == "rollouts" and self.snap is not None and self.snap.rollouts:
            chosen = self.snap.rollouts[min(self.selected, len(self.snap.rollouts) - 1)]
            self.opened, self.offset = detail(self.state, chosen.rollout_id), 0
            return False
        if k in ("\r", "\n") and picks and (query := self._pick_query()) is not None:
            self.query, self.view, self.selected, self.offset = query, "rollouts", 0, 0
            return False
        section = KEYS.get(k)
        if k.isdigit() and (int(k) or 10) <= len(views.VIEWS):  # 1..9, then 0 for the tenth
            section = views.VIEWS[(int(k) or 10) - 1][1]
        if section not in (None, self.view) and (section != "compare" or self.other is not None):
            self.view, self.offset, self.selected, self.opened = str(section), 0, 0, None
        return False

    def _pick_query(self) -> str | None:
        """The search listing the selected item's rollouts: a termination reason, a worst consistency step."""
        snap = self.snap
        if snap is None:
            return None
        if self.view == "terminations" and snap.terminations and snap.terminations.examples:
            reasons = list(snap.terminations.examples)
            return f"reason:{reasons[min(self.selected, len(reasons) - 1)]}"
        if self.view == "consistency" and snap.consistency and snap.consistency.worst:
            worst = snap.consistency.worst
            return f"step:{worst[min(self.selected, len(worst) - 1)].step}"
        return None

    # -- drawing ---------------------------------------------------------------------------------------

    def render(self, width: int, height: int) -> RenderableType:
        snap = self.snap or self.refresh()
        if self.listing_stages:
            return Group(views.stages_header(str(self.root)), Rule(style="dim"),
                         views.stages(self.stage_infos, self.selected), Rule(style="dim"),
                         views.footer(False, stages=True))
        top = views.header(snap, self.view, self.other is not None, self.query)
        if self.typing is not None:
            top.append(
                "\nsearch (task: harness: reason: tool: step:, enter to apply, esc to cancel): "
                + self.typing
                + "█",
                "magenta",
            )
        notes = views.notes(snap)
        n_notes = len(snap.notes)
        body_h = max(5, height - 6 - n_notes - (1 if self.typing is not None else 0))
        body = self.body(snap, width, body_h)
        return Group(
            top, Rule(style="dim"), body, Rule(style="dim"), notes,
            views.footer(self.opened is not None, stage=self.stage_open.name if self.stage_open else None),
        )

    def body(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        if self.opened is not None:
            lines = views.drill_lines(self.opened)
            self.offset = min(self.offset, max(0, len(lines) - height))
            return views.drill(lines, self.offset, height)
        v = self.view
        if v == "overview":
            return views.overview(snap, width)
        if v == "curves":
            n = sum(1 for _ in snap.curves or ()) + len(views.PANELS)
            self.offset = min(self.offset, max(0, n - height))
            return views.curves(snap, width, height, self.offset)
        if v == "terminations":
            n = len(snap.terminations.examples) if snap.terminations else 0
            self.selected = min(self.selected, max(0, n - 1))
            return views.terminations(snap, height, self.selected)
        if v == "timing":
            return views.timing(snap, height)
        if v == "tasks":
            n = len(snap.tasks.tasks) if snap.tasks else 0
            self.offset = min(self.offset, max(0, n - 1))
            return views.tasks(snap, width, height, self.offset)
        if v == "consistency":
            n = len(snap.consistency.worst) if snap.consistency else 0
            self.selected = min(self.selected, max(0, n - 1))
            return views.consistency(snap, height, self.selected)
        if v == "rollouts":
            n = len(snap.rollouts or [])
            self.selected = min(self.selected, max(0, n - 1))
            return views.rollouts(snap.rollouts, height, self.selected, self.query)
        if v == "behaviour":
            return views.behaviour(snap)
        if v == "pipeline":
            return views.pipeline(snap, height)
        return views.compare(self.comparison, width, height)


# -- the two ways to run it -----------------------------------------------------------------------------


ONCE_WIDTH = 160
"""Columns of ``--once`` output written to a log or a pipe (a terminal gets its own width)."""


def render_once(mon: Monitor, console: Console, rollout: str | None = None) -> None:
    """Every view, one after the other (what ``--once`` prints); for a folder of runs, the list of stages and
    then each stage's views."""
    # Off a terminal the console does not fold (cli.console.NO_WRAP_WIDTH), but rules and grids still need a width
    # to fill: a log gets the width of a wide terminal, not a rule of 100,000 characters.
    width = console.width if console.is_terminal else min(console.width, ONCE_WIDTH)
    mon.refresh_stages()
    if mon.stage_infos:
        console.print(views.stages_header(str(mon.root)))
        console.print(views.stages(mon.stage_infos, None))
        for info in mon.stage_infos:
            console.print(Rule(f"stage {info.name}", style="bold"), width=width)
            render_once(Monitor(Path(info.path), kl_warn=mon.kl_warn), console, rollout)
        return
    snap = mon.refresh(SECTIONS)
    tall = 40
    console.print(views.header(snap, "", mon.other is not None, mon.query))
    console.print(views.notes(snap))
    for _, section, title in views.VIEWS:
        if section == "compare" and mon.other is None:
            continue
        console.print(Rule(title), width=width)
        if section == "rollouts":
            console.print(views.rollouts((snap.rollouts or [])[:20], 28, -1, mon.query))
        elif section == "compare":
            console.print(views.compare(mon.comparison, width, tall))
        elif section == "tasks":
            console.print(views.tasks(snap, width, tall, 0))
        elif section == "terminations":
            console.print(views.terminations(snap, tall))
        elif section == "curves":
            console.print(views.curves(snap, width, 10_000))
        elif section == "consistency":
            console.print(views.consistency(snap, tall))
        else:
            mon.view = section
            console.print(mon.body(snap, width, tall))
    if rollout is not None:
        d = detail(mon.state, rollout)
        console.print(Rule(f"rollout {rollout}"), width=width)
        console.print(
            views.drill(views.drill_lines(d), 0, 10_000, wrap=True)
            if d
            else Text(f"no rollout {rollout!r} in this run", "red")
        )


def snapshot_json(mon: Monitor, rollout: str | None = None) -> str:
    mon.refresh_stages()
    if mon.stage_infos:  # a folder of runs: its stages, each with its snapshot
        return json.dumps({"root": str(mon.root), "stages": [
            {**i.model_dump(mode="json"),
             "snapshot": json.loads(snapshot_json(Monitor(Path(i.path), kl_warn=mon.kl_warn), rollout))}
            for i in mon.stage_infos]}, indent=1)
    snap = mon.refresh(SECTIONS)
    data = snap.model_dump(mode="json")
    if mon.comparison is not None:
        data["compare"] = mon.comparison.model_dump(mode="json")
    if rollout is not None:
        d = detail(mon.state, rollout)
        data["rollout"] = d.model_dump(mode="json") if d else None
    return json.dumps(data, indent=1)


@contextmanager
def cbreak(stream: TextIO) -> Iterator[int | None]:
    """The terminal in cbreak mode (keys arrive one by one, unechoed) for the duration; restored after."""
    if not stream.isatty():
        yield None
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


_SEQ = {
    "\x1b[A": "UP",
    "\x1b[B": "DOWN",
    "\x1b[5~": "PGUP",
    "\x1b[6~": "PGDN",
    "\x1bOA": "UP",
    "\x1bOB": "DOWN",
}


def split_keys(data: str) -> list[str]:
    """Raw terminal input as keys: escape sequences for arrows and pages, else one character each."""
    keys, i = [], 0
    while i < len(data):
        for seq, name in _SEQ.items():
            if data.startswith(seq, i):
                keys.append(name)
                i += len(seq)
                break
        else:
            keys.append(data[i])
            i += 1
    return keys


def run_live(mon: Monitor, console: Console, refresh_s: float) -> None:
    """Redraw every ``refresh_s`` and on each key until ``q`` (or Ctrl-C)."""
    with (
        cbreak(sys.stdin) as fd,
        Live(
            console=console, screen=True, auto_refresh=False, redirect_stdout=False, redirect_stderr=False
        ) as live,
    ):
        mon.refresh()
        next_tick = time.monotonic() + refresh_s
        while True:
            size = console.size
            live.update(mon.render(size.width, size.height), refresh=True)
            wait = max(0.0, next_tick - time.monotonic())
            ready = False
            if fd is None:  # not a terminal (a pipe): no keys, only the timer
                time.sleep(wait)
            else:
                ready = bool(select.select([fd], [], [], wait)[0])
            if ready and fd is not None:
                data = os.read(fd, 64).decode("utf-8", "replace")
                if any(mon.key(k) for k in split_keys(data)):
                    return
                mon.refresh()  # the view or the search may have changed: rebuild what is shown
            if time.monotonic() >= next_tick:
                mon.refresh()
                next_tick = time.monotonic() + refresh_s
