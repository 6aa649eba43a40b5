"""RunState: a run followed as it grows (each line read once), and every way a run directory can be broken
turned into a note that names the file and line, with everything else still read."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from monitor_runs import TOY

from lego_rl.monitor.state import RunState

EVENTS = (TOY / "events.jsonl").read_bytes().splitlines(keepends=True)
FINISHED = sum(1 for line in EVENTS if b'"kind":"rollout_finished"' in line)


def _texts(state: RunState) -> str:
    return "\n".join(n.text for n in state.notes())


def _fresh(tmp_path: Path) -> Path:
    root = tmp_path / "live"
    root.mkdir()
    (root / "config.json").write_bytes((TOY / "config.json").read_bytes())
    return root


def test_a_growing_run_is_read_once_line_by_line_and_a_torn_tail_waits_for_its_newline(
    tmp_path: Path,
) -> None:
    root = _fresh(tmp_path)
    log = root / "events.jsonl"
    state = RunState(root)
    assert state.refresh() == 0 and "does not exist (yet)" in _texts(state)
    half = len(EVENTS) // 2
    log.write_bytes(b"".join(EVENTS[:half]))
    assert state.refresh() == half
    assert state.status(time.time()) == "running" and state.steps and state.finished is None
    # a writer mid-line: the fragment is not an event yet, and is noted
    torn = EVENTS[half][:25]
    with log.open("ab") as fh:
        fh.write(torn)
    assert state.refresh() == 0
    assert f"ends in an incomplete line ({len(torn)} bytes" in _texts(state)
    with log.open("ab") as fh:
        fh.write(EVENTS[half][25:] + b"".join(EVENTS[half + 1 :]))
    assert state.refresh() == len(EVENTS) - half
    assert state.events.follower.cursor.offset == log.stat().st_size  # nothing left, nothing read twice
    assert state.refresh() == 0
    assert sum(state.terminations.values()) == FINISHED and not state.in_flight
    assert state.finished is not None and state.status(time.time()) == "finished (completed)"
    assert "incomplete line" not in _texts(state)


def test_lines_that_do_not_parse_are_named_and_stepped_over(tmp_path: Path) -> None:
    root = _fresh(tmp_path)
    lines = list(EVENTS)
    lines.insert(40, b'{"kind":"rollout_finished","rollout_id":"x"}\n')
    lines.insert(80, b"\x00garbage\n")
    (root / "events.jsonl").write_bytes(b"".join(lines))
    state = RunState(root)
    assert state.refresh() == len(EVENTS)
    text = _texts(state)
    assert "events.jsonl:41: not a valid record: rollout_finished.termination: Field required" in text
    assert "events.jsonl:81: not a valid record" in text
    assert sum(state.terminations.values()) == FINISHED  # everything after the bad lines still counted


def test_a_crashed_run_is_called_stalled_with_its_unfinished_rollouts(tmp_path: Path) -> None:
    root = _fresh(tmp_path)
    cut = next(i for i, line in enumerate(EVENTS) if b'"step":3' in line and b"step_started" in line) + 5
    (root / "events.jsonl").write_bytes(b"".join(EVENTS[:cut]))
    hour_ago = time.time() - 3600
    os.utime(root / "events.jsonl", (hour_ago, hour_ago))
    state = RunState(root)
    state.refresh()
    assert state.status(time.time()) == "stalled or crashed"
    assert "no event for 60 min and no training_finished" in _texts(state)
    assert f"{len(state.in_flight)} rollouts never finished" in _texts(state) and len(state.in_flight) == 4
    assert "metrics.jsonl does not exist yet" in _texts(state)


def test_missing_and_empty_directories_are_notes(tmp_path: Path) -> None:
    assert [n.text for n in RunState(tmp_path / "nope").notes()] == [
        f"{tmp_path / 'nope'}: no such directory"
    ]
    state = RunState(tmp_path)
    state.refresh()
    assert f"{tmp_path} holds no run (no config.json, no events.jsonl)" in _texts(state)
    (tmp_path / "config.json").write_text("{not json")
    state = RunState(tmp_path)
    assert "config.json: not readable as JSON" in _texts(state)


def test_a_copied_run_is_read_where_it_is_not_where_its_config_says_it_was(
    copy_run: Callable[[Path], Path],
) -> None:
    root = copy_run(TOY)
    config = json.loads((root / "config.json").read_text())
    assert config["paths"]["run_log"]["value"].endswith(
        "/events.jsonl"
    )  # an absolute path under the old root
    (root / "events.jsonl").write_bytes(b"".join(EVENTS[:30]))
    state = RunState(root)
    assert state.refresh() == 30 + 16  # this copy's 30 events and its 16 metrics rows
    assert state.layout.events == root / "events.jsonl"


def test_a_log_moved_outside_the_run_root_is_followed_there(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    elsewhere = tmp_path / "logs" / "run.jsonl"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"".join(EVENTS))
    config = {"paths": {"run_root": {"value": str(root)}, "run_log": {"value": str(elsewhere)}}}
    (root / "config.json").write_text(json.dumps(config))
    state = RunState(root)
    state.refresh()
    assert sum(state.terminations.values()) == FINISHED


def test_skip_line_steps_over_one_complete_line_only(tmp_path: Path) -> None:
    from lego_rl.runstore import RunLogError, follow_events

    log = tmp_path / "events.jsonl"
    log.write_bytes(b"bad\n" + EVENTS[0] + EVENTS[1][:10])
    follower = follow_events(log)
    try:
        list(follower.read())
    except RunLogError as exc:
        assert exc.line == 1
    assert follower.skip_line() and follower.cursor.line == 1 and follower.cursor.offset == 4
    assert [e.kind for e in follower.read()] == ["run_started"]
    assert not follower.skip_line()  # a torn tail is not a line to skip: it may still be completed
    assert not follow_events(tmp_path / "missing.jsonl").skip_line()


def test_a_log_replaced_under_its_name_is_counted_afresh_not_added_to(tmp_path: Path) -> None:
    root = _fresh(tmp_path)
    log = root / "events.jsonl"
    log.write_bytes(b"".join(EVENTS))
    state = RunState(root)
    state.refresh()
    assert sum(state.terminations.values()) == FINISHED
    head = EVENTS[:60]
    fresh = root / "events.jsonl.new"
    fresh.write_bytes(b"".join(head))
    fresh.replace(log)  # another inode under the same name: a new run written in this directory
    state.refresh()
    assert sum(state.terminations.values()) == sum(b'"rollout_finished"' in line for line in head)
    assert "events.jsonl was replaced or cut shorter while followed" in _texts(state)
    log.write_bytes(b"".join(head[:10]))  # cut shorter in place
    state.refresh()
    assert state.events_read == 10


def test_a_monitor_started_before_the_run_picks_up_its_config(tmp_path: Path) -> None:
    root = tmp_path / "early"
    root.mkdir()
    state = RunState(root)
    state.refresh()
    assert "holds no run" in _texts(state)
    (root / "config.json").write_bytes((TOY / "config.json").read_bytes())
    (root / "events.jsonl").write_bytes(b"".join(EVENTS[:20]))
    state.refresh()
    assert state.config_int("train", "num_rollout") == 16 and state.events_read == 20
