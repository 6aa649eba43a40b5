"""runstore.log: typed events round-trip, and followers tail a growing log: concurrent writer, partial
line, rotation, truncation, a malformed line, resuming from a cursor."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from lego_rl.runstore.events import (
    AgentExited,
    LogRepaired,
    RolloutFinished,
    RolloutStarted,
    StageFinished,
    event_kinds,
    parse_event,
)
from lego_rl.runstore.log import (
    Cursor,
    EventLog,
    MetricsLog,
    RunLogError,
    follow_events,
    follow_metrics,
    read_events,
)
from lego_rl.runstore.metrics import StepMetrics
from lego_rl.termination import TerminationReason


def _started(n: int) -> RolloutStarted:
    return RolloutStarted(rollout_id=f"r{n}", instance_id="t", harness="codex", index=n)


def test_events_round_trip_typed_with_kind_first(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.emit(_started(0))
    log.emit(
        RolloutFinished(
            rollout_id="r0",
            termination=TerminationReason.INTERNAL_ERROR,
            reward=None,
            infrastructure_failure=True,
            traceback="Traceback ...",
        )
    )
    log.close()
    first = (tmp_path / "events.jsonl").read_text().splitlines()[0]
    assert first.startswith('{"kind":"rollout_started"')
    started, finished = read_events(tmp_path / "events.jsonl")
    assert isinstance(started, RolloutStarted) and started.index == 0
    assert isinstance(finished, RolloutFinished) and finished.termination is TerminationReason.INTERNAL_ERROR


def test_models_refuse_unknown_fields_and_kinds() -> None:
    with pytest.raises(ValueError, match="outcome"):
        AgentExited(rollout_id="r", cli_s=1.0, exit_code=1, outcome="adapter_error")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="no_such_kind"):
        parse_event('{"kind":"no_such_kind","ts":1}')
    assert "rollout_finished" in event_kinds() and "session_close_failed" in event_kinds()


def test_follower_with_a_concurrent_writer_sees_every_event_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    follower = follow_events(path)
    seen: list[int] = []

    def write() -> None:
        for n in range(2000):
            log.emit(_started(n))

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        seen += [e.index for e in follower.read()]  # type: ignore[union-attr]
    writer.join()
    seen += [e.index for e in follower.read()]  # type: ignore[union-attr]
    log.close()
    assert seen == list(range(2000))
    assert follower.cursor.offset == path.stat().st_size and follower.cursor.line == 2000


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    line = _started(1).model_dump_json()
    path.write_text(_started(0).model_dump_json() + "\n" + line[:20])
    follower = follow_events(path)
    assert [e.rollout_id for e in follower.read()] == ["r0"]  # type: ignore[union-attr]
    assert list(follower.read()) == []
    with path.open("a") as fh:
        fh.write(line[20:] + "\n")
    assert [e.rollout_id for e in follower.read()] == ["r1"]  # type: ignore[union-attr]


def test_a_cursor_resumes_exactly_after_the_last_line_read(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for n in range(3):
        log.emit(_started(n))
    first = follow_events(path)
    assert len(list(first.read())) == 3
    saved = first.cursor
    log.emit(_started(3))
    log.close()
    later = follow_events(path, cursor=Cursor(**json.loads(json.dumps(saved.__dict__))))
    assert [e.rollout_id for e in later.read()] == ["r3"]  # type: ignore[union-attr]


def test_rotation_and_truncation_restart_from_the_top(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventLog(path).emit(_started(0))
    follower = follow_events(path)
    assert len(list(follower.read())) == 1
    os.rename(path, tmp_path / "events.1.jsonl")  # rotated: a new file takes the name
    fresh = EventLog(path)
    fresh.emit(_started(7))
    fresh.close()
    assert [e.rollout_id for e in follower.read()] == ["r7"]  # type: ignore[union-attr]
    with path.open("r+") as fh:  # same inode, cut shorter than the cursor
        fh.truncate(0)
    assert list(follower.read()) == [] and follower.cursor.offset == 0
    path.write_text(_started(8).model_dump_json() + "\n")
    assert [e.rollout_id for e in follower.read()] == ["r8"]  # type: ignore[union-attr]


def test_malformed_line_is_an_error_naming_file_and_line_after_the_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        _started(0).model_dump_json()
        + "\n\n"
        + '{"kind":"stage","rollout_id":"r0"}\n'
        + _started(1).model_dump_json()
        + "\n"
    )
    follower = follow_events(path)
    got = []
    with pytest.raises(RunLogError, match=r"events\.jsonl:3: not a valid record: .*stage") as err:
        for event in follower.read():
            got.append(event)  # noqa: PERF402 - list() would lose the events before the error
    assert err.value.line == 3 and len(got) == 1
    assert follower.cursor.line == 2  # the bad line is not skipped: reading again fails on it again
    with pytest.raises(RunLogError, match=":3:"):
        list(follower.read())
    with pytest.raises(RunLogError, match=":1: .*not valid JSON|:1: .*Invalid JSON"):
        (tmp_path / "bad.jsonl").write_text("{not json\n")
        read_events(tmp_path / "bad.jsonl")


def test_reopening_a_log_with_a_torn_line_repairs_it_and_keeps_the_fragment(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(_started(0).model_dump_json() + "\n" + '{"kind":"stage","rol')
    assert [e.kind for e in read_events(path)] == ["rollout_started"]  # the torn line is not an event
    log = EventLog(path)
    log.emit(StageFinished(rollout_id="r0", stage="agent", status="ok", duration_s=1.0))
    log.close()
    events = read_events(path)
    assert [e.kind for e in events] == ["rollout_started", "log_repaired", "stage"]
    assert isinstance(events[1], LogRepaired) and events[1].fragment == '{"kind":"stage","rol'


def test_metrics_rows_validate_and_follow(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append(
        StepMetrics(
            step=0,
            started_at=10.0,
            finished_at=12.5,
            values={"loss": 0.25},
            terminations={TerminationReason.COMPLETED: 7, TerminationReason.SANDBOX_LOST: 1},
        )
    )
    log.close()
    (row,) = list(follow_metrics(tmp_path / "metrics.jsonl").read())
    assert row.values == {"loss": 0.25} and row.terminations[TerminationReason.SANDBOX_LOST] == 1
    with pytest.raises(ValueError, match="finite"):
        StepMetrics(step=1, started_at=0, finished_at=1, values={"loss": float("nan")})
    with pytest.raises(ValueError, match="before it started"):
        StepMetrics(step=1, started_at=5, finished_at=1)
    with pytest.raises(ValueError, match="no_such_reason"):
        StepMetrics.model_validate(
            {"step": 1, "started_at": 0, "finished_at": 1, "terminations": {"no_such_reason": 1}}
        )


async def test_follow_yields_events_as_they_are_written(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)

    async def write_later() -> None:
        for n in range(3):
            await asyncio.sleep(0.02)
            log.emit(_started(n))

    writer = asyncio.create_task(write_later())
    got: list[str] = []
    async with asyncio.timeout(5):
        async for event in follow_events(path).follow(interval_s=0.01):
            got.append(event.rollout_id)  # type: ignore[union-attr]
            if len(got) == 3:
                break
    await writer
    log.close()
    assert got == ["r0", "r1", "r2"]
