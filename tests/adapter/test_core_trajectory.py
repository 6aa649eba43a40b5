"""The core's turn records, fed to the real TrajectoryManager, give one exact training sequence.

A multi-turn tool loop with the shared TEST DOUBLE ``ScriptedPolicyEngine`` (chosen text, real tokenizer,
real tiny-model logprobs): every turn after the first is bridged, so the whole session is one segment
whose loss-masked tokens are exactly the ids the engine sampled, with their logprobs. A compacted
history (full re-render) then starts a second segment.
"""

from __future__ import annotations

from pathlib import Path

from support.scripted_engine import ScriptedPolicyEngine, tool_call_text

from lego_rl.adapter.canonical import CanonicalRequest, Message, ToolSpec
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.chat.render import ChatRenderer
from lego_rl.trajectory.manager import TrajectoryManager, TrajectoryOptions

BASH = ToolSpec(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})


async def test_bridged_session_is_one_exact_segment(tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    script = [
        "<think>\nexplore\n</think>\n\n" + tool_call_text("bash", {"cmd": "ls"}),
        tool_call_text("bash", {"cmd": "cat a.py"}, before="Reading."),
        "Fixed it.",
        "Summary after compaction.",
    ]
    engine = ScriptedPolicyEngine(tiny_model_dir, script)
    core = AdapterCore(renderer, engine, max_context_tokens=8192, verify_bridges=True)
    session = SessionRegistry().open("traj", template_kwargs={"reasoning_effort": "low"})
    history = [Message(role="system", content="agent"), Message(role="user", content="fix a.py")]
    for n in range(3):
        resp = await core.run_turn(
            session, CanonicalRequest(protocol="anthropic", messages=history, tools=[BASH])
        )
        history.append(Message(role="assistant", content=resp.text, tool_calls=resp.tool_calls))
        history += [Message(role="tool", tool_call_id=c.id, content=f"output {n}") for c in resp.tool_calls]
        if not resp.tool_calls:
            history.append(Message(role="user", content="summarise"))
    compacted = [history[0], Message(role="user", content="summary of the work so far; summarise")]
    await core.run_turn(session, CanonicalRequest(protocol="anthropic", messages=compacted, tools=[BASH]))
    assert [r.render_mode for r in session.records] == ["full", "bridged", "bridged", "full"]

    for verify in (True, False):
        manager = TrajectoryManager(TrajectoryOptions(verify_bridged_prefix=verify))
        for rec in session.records:
            manager.add_turn(rec)
        first, second = manager.samples(rollout_id="r", group_index=0, index=0, reward=1.0)
        assert manager.stats.bridged_mismatches == 0
        trained = [t for t, m in zip(first.tokens, first.loss_mask, strict=True) if m]
        assert trained == [t for call in engine.calls[:3] for t in call.output_ids]
        logps = [lp for lp, m in zip(first.rollout_logprobs, first.loss_mask, strict=True) if m]
        assert logps == [lp for call in engine.calls[:3] for lp in call.logprobs]
        assert first.tokens == engine.calls[2].prompt_ids + engine.calls[2].output_ids
        assert second.tokens == engine.calls[3].prompt_ids + engine.calls[3].output_ids
