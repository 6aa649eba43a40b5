"""The report's rollouts: a list of finished rollouts and a drill-down of a few (timeline, turns and tool calls,
transcript excerpt, patch excerpt, the grader's verdict per test), each bounded so a run of 10,000 rollouts
gives a report of the same size as a run of 10.

Which rollouts are opened: every rollout of a run outside training steps (a rollout-check, up to
``DRILL_ROLLOUTS``), else the latest example of each termination reason and the latest solved rollout, newest
first. The drill-down reads what ``drill.detail`` reads (the run store's rollout folder) with its size caps.
"""

from __future__ import annotations

import re
from html import escape

from lego_rl.monitor.drill import RolloutDetail, detail
from lego_rl.monitor.state import Rollout, RunState
from lego_rl.runstore import RolloutFiles

DRILL_ROLLOUTS = 12
LISTED_ROLLOUTS = 30
TURNS_SHOWN = 24
TRANSCRIPT_LINES = 20
PATCH_CHARS = 3000
TEXT_CHARS = 160
GRADER_BYTES = 262_144
"""How much of a grader log is read for its per-test results (they are near its end)."""
_SECTION = re.compile(r"^===== (.*)$", re.MULTILINE)
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS|COLLECT|PROBLEM)\s+(.*)$")


def grader_sections(text: str) -> dict[str, list[str]]:
    """The grader log's per-test results and verdict: section title → its lines, for the sections titled
    ``per-test results (...)``, ``baseline per-test results (...)`` and ``verdict`` (the format of
    ``swe.testresults.format_results`` and the grader's ``_Log.note``: ``STATUS   test id`` lines)."""
    marks = list(_SECTION.finditer(text))
    out: dict[str, list[str]] = {}
    for i, m in enumerate(marks):
        title = m.group(1).strip()
        if not (title.startswith(("per-test results", "baseline per-test results")) or title == "verdict"):
            continue
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[title] = [ln for ln in text[m.end():end].splitlines() if ln.strip()]
    return out


def _tests_table(sections: dict[str, list[str]]) -> str:
    """One row per test: its status after the patch and, where the grader ran one, at baseline."""
    after = next((v for k, v in sections.items() if k.startswith("per-test results")), [])
    base = next((v for k, v in sections.items() if k.startswith("baseline per-test results")), [])
    base_status = {m.group(2): m.group(1) for ln in base if (m := _RESULT.match(ln))}
    rows, notes = [], []
    for ln in after:
        m = _RESULT.match(ln)
        if m is None:
            notes.append(ln)
            continue
        status, name = m.groups()
        cls = "ok" if status == "PASSED" else "bad"
        rows.append(f'<tr><td class="l">{escape(name)}</td><td class="{cls}">{status}</td>'
                    f"<td>{escape(base_status.get(name, '-'))}</td></tr>")
    verdict = " ".join(sections.get("verdict", []))
    head = f"<p><b>grader verdict:</b> {escape(verdict)}</p>" if verdict else ""
    if not rows:
        return head + '<p class="empty">no per-test results in the grader log</p>'
    return (head + '<table><tr><th class="l">test</th><th>after the patch</th><th>at baseline</th></tr>'
            + "".join(rows) + "</table>" + "".join(f'<p class="note-info">{escape(n)}</p>' for n in notes))


def _grader(state: RunState, r: Rollout) -> str:
    path = state.artifact_dir(r.rollout_id) / RolloutFiles.GRADER_LOG
    if not path.is_file():
        return '<p class="empty">no grader log saved</p>'
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - GRADER_BYTES))
        text = fh.read().decode("utf-8", "replace")
    return _tests_table(grader_sections(text))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"… [{len(text) - n} more characters]"


def _one(state: RunState, r: Rollout, d: RolloutDetail, *, first: bool) -> str:
    """One rollout opened up (``first``: shown unfolded, the rest fold to their summary line)."""
    b = d.rollout
    summary = (f"{escape(b.rollout_id)}: {escape(b.instance_id)} on {escape(b.harness)}, "
               f"{escape(b.termination or 'in flight')}, reward {b.reward if b.reward is not None else '-'}, "
               f"{b.turns} turns" + (f", step {b.step}" if b.step is not None else ""))
    turns = "".join(
        f"<tr><td>{t.turn}</td><td class=\"l\">{escape(t.kind)}</td><td class=\"l\">{escape(t.render_mode)}</td>"
        f"<td>{t.output_tokens}</td><td>{t.tool_calls}</td><td class=\"l\">{escape(', '.join(t.tools))}</td>"
        f"<td class=\"l\">{escape(t.finish_reason)}</td><td class=\"l t\">{escape(_cut(t.text, TEXT_CHARS))}</td></tr>"
        for t in d.turns[:TURNS_SHOWN]
    )
    more_turns = len(d.turns) - TURNS_SHOWN
    turns_html = (
        '<table><tr><th>turn</th><th class="l">kind</th><th class="l">render</th><th>output tokens</th>'
        '<th>tool calls</th><th class="l">tools</th><th class="l">finish</th><th class="l">sampled text</th></tr>'
        + turns + "</table>" + (f"<p>{more_turns} more turns not shown</p>" if more_turns > 0 else "")
        if d.turns else '<p class="empty">no turn records saved</p>'
    )
    transcript = d.transcript[-TRANSCRIPT_LINES:]
    parts = [
        f'<details class="rollout" id="rollout-{escape(b.rollout_id)}"{" open" if first else ""}>'
        f"<summary>{summary}</summary>",
        "<h4>timeline</h4><pre>" + escape("\n".join(d.timeline)) + "</pre>",
        "<h4>turns and tool calls</h4>" + turns_html,
        "<h4>transcript (last lines of the CLI's event log)</h4>"
        + ("<pre>" + escape("\n".join(transcript)) + "</pre>" if transcript
           else '<p class="empty">no CLI transcript saved</p>'),
        "<h4>grader</h4>" + _grader(state, r),
        "<h4>patch</h4>" + ("<pre>" + escape(_cut(d.patch, PATCH_CHARS)) + "</pre>" if d.patch
                            else '<p class="empty">no patch saved</p>'),
    ]
    if d.problems:
        parts.append("<h4>problems</h4><ul>" + "".join(f"<li>{escape(p)}</li>" for p in d.problems) + "</ul>")
    if d.note:
        parts.append(f'<p class="empty">{escape(d.note)}</p>')
    parts.append(f"<p>artifacts in {escape(d.folder)}: "
                 + escape(", ".join(f"{k} ({v:,} B)" for k, v in d.artifacts.items()) or "none") + "</p>")
    return "".join(parts) + "</details>"


def picked(state: RunState) -> list[Rollout]:
    """The rollouts the drill-down opens (see the module doc), newest first."""
    done = [r for r in state.rollouts.values() if r.termination is not None]
    outside = [r for r in done if r.step is None]
    if outside and len(outside) == len(done):
        return outside[::-1][:DRILL_ROLLOUTS]
    chosen: dict[str, Rollout] = {}
    for examples in state.examples.values():
        if examples:
            chosen[examples[-1].rollout_id] = examples[-1]
    solved = next((r for r in reversed(done) if r.outcome == "solved"), None)
    if solved is not None:
        chosen[solved.rollout_id] = solved
    return sorted(chosen.values(), key=lambda r: -(r.finished or 0.0))[:DRILL_ROLLOUTS]


def rollouts(state: RunState) -> str:
    done = [r for r in state.rollouts.values() if r.termination is not None]
    if not done:
        return '<p class="empty">no finished rollouts</p>'
    listed = done[::-1][:LISTED_ROLLOUTS]
    table = "".join(
        f'<tr><td class="l">{escape(r.rollout_id)}</td><td class="l">{escape(r.instance_id)}</td>'
        f'<td class="l">{escape(r.harness)}</td><td>{"-" if r.step is None else r.step}</td>'
        f'<td class="l">{escape(r.termination or "")}</td><td>{"-" if r.reward is None else f"{r.reward:g}"}</td>'
        f"<td>{r.turns}</td></tr>"
        for r in listed
    )
    head = (f"<details><summary>{len(done):,} finished rollouts; the latest {len(listed)} listed, newest "
            'first</summary><table><tr><th class="l">rollout</th><th class="l">task</th><th class="l">harness</th><th>step</th>'
            '<th class="l">termination</th><th>reward</th><th>turns</th></tr>' + table + "</table></details>")
    opened: list[str] = []
    for r in picked(state):
        d = detail(state, r.rollout_id)
        if d is not None:
            opened.append(_one(state, r, d, first=not opened))
    return (head + f"<h3>drill-down: {len(opened)} rollouts (the latest of each termination reason and the "
            "latest solved; every rollout of a run outside training steps)</h3>" + "".join(opened))
