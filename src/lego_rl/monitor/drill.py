"""One rollout opened up: its events as a timeline and its saved artifacts (CLI transcript, tool calls per
turn, the patch, the grader's log), each read with a size cap so a 100 MB transcript cannot stall the
monitor."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from lego_rl.monitor.snapshot import TOOL_RE, RolloutBrief, _turn_records, artifact_files, brief
from lego_rl.monitor.state import RunState
from lego_rl.runstore import RolloutFiles

TAIL_BYTES = 16_384
"""How much of the end of a long text artifact is shown."""


class TurnBrief(BaseModel):
    turn: int
    kind: str
    render_mode: str
    output_tokens: int
    tool_calls: int
    tools: list[str]
    finish_reason: str
    text: str
    """The sampled text, cut to 300 characters."""


class RolloutDetail(BaseModel):
    rollout: RolloutBrief
    timeline: list[str]
    """``+seconds  what``, in order."""
    folder: str
    artifacts: dict[str, int]
    """File name → bytes."""
    turns: list[TurnBrief]
    transcript: list[str]
    """The CLI's own event log (``*-events.jsonl``, ``cli-*``), last lines, one summary line each."""
    patch: str | None
    grader_log: str | None
    problems: list[str]
    note: str | None = None


def _tail(path: Path, limit: int = TAIL_BYTES) -> str:
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - limit))
        data = fh.read()
    text = data.decode("utf-8", "replace")
    return (f"[... {size - limit} bytes before]\n" if size > limit else "") + text


def _summary(line: str) -> str:
    """One CLI event as a short line: its type and what it carries."""
    try:
        ev = json.loads(line)
    except ValueError:
        return line[:200]
    if not isinstance(ev, dict):
        return line[:200]
    kind = str(ev.get("type") or ev.get("kind") or ev.get("event") or "?")
    sub = ev.get("subtype")
    bits = [kind + (f"/{sub}" if sub else "")]
    msg = ev.get("message")
    if isinstance(msg, dict) and isinstance(msg.get("content"), list):
        for part in msg["content"]:
            if isinstance(part, dict):
                if part.get("type") == "tool_use":
                    bits.append(f"tool_use {part.get('name')} {json.dumps(part.get('input'))[:120]}")
                elif part.get("type") == "text":
                    bits.append(repr(str(part.get("text"))[:120]))
                elif part.get("type") == "tool_result":
                    bits.append(f"tool_result {str(part.get('content'))[:100]!r}")
    elif "result" in ev:
        bits.append(repr(str(ev["result"])[:160]))
    return "  ".join(bits)


def detail(state: RunState, rollout_id: str) -> RolloutDetail | None:
    """The rollout's detail, or None when the run has no rollout of that id."""
    r = state.rollouts.get(rollout_id)
    if r is None:
        return None
    t0 = r.started
    # The step open when it started, never the step that trained it: an asynchronous run trains a rollout
    # started during step 0 in step 1 (said on its own line below).
    timeline = [
        f"+{0.0:8.2f}s  started: {r.instance_id} on {r.harness}, group {r.group_index} #{r.index}"
        + (f", during step {r.started_step}" if r.started_step is not None else "")
    ]
    elapsed = 0.0
    for stage, (status, seconds) in r.stages.items():
        elapsed += seconds
        timeline.append(f"+{elapsed:8.2f}s  {stage}: {status} ({seconds:.2f}s)")
    if r.exit_code is not None:
        timeline.append(f"{'':11}  agent exited with code {r.exit_code}")
    if r.finished is not None:
        timeline.append(
            f"+{r.finished - t0:8.2f}s  finished: {r.termination}, reward {r.reward}, {r.turns} turns"
            + (" (infrastructure)" if r.infrastructure else "")
            + (f": {r.detail}" if r.detail else "")
        )
    else:
        timeline.append(f"{'':11}  in flight")
    if r.refilled_by:
        timeline.append(f"{'':11}  refilled by {r.refilled_by}")
    if r.counted_in is not None:
        policy = f" (sampled from policy {r.started_policy})" if r.started_policy is not None else ""
        timeline.append(f"{'':11}  in step {r.counted_in}'s batch{policy}")
    folder = state.artifact_dir(rollout_id)
    files = artifact_files(state, rollout_id)
    note = None if files else f"no artifacts in {folder} (environment rollouts save none; or not saved yet)"
    turns = []
    for rec in _turn_records(state, r):
        turns.append(
            TurnBrief(
                turn=rec.turn,
                kind=rec.kind,
                render_mode=rec.render_mode,
                output_tokens=len(rec.output_ids),
                tool_calls=rec.tool_calls,
                tools=[a or b for a, b in TOOL_RE.findall(rec.text)],
                finish_reason=rec.finish_reason,
                text=rec.text[:300],
            )
        )
    transcript: list[str] = []
    for path in files:
        if RolloutFiles.is_transcript(path.name):
            lines = [ln for ln in _tail(path).splitlines() if ln.strip()]
            transcript.append(f"== {path.name}")
            transcript.extend(_summary(ln) for ln in lines[-40:])
    patch = folder / RolloutFiles.PATCH
    grader = folder / RolloutFiles.GRADER_LOG
    return RolloutDetail(
        rollout=brief(r),
        timeline=timeline,
        folder=str(folder),
        artifacts={p.name: p.stat().st_size for p in files},
        turns=turns,
        transcript=transcript,
        patch=_tail(patch) if patch.is_file() else None,
        grader_log=_tail(grader) if grader.is_file() else None,
        problems=list(r.problems),
        note=note,
    )
