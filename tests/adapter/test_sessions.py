"""Session registry: opening, isolation, rejection of unknown/closed sessions, saving turn records."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.scripted_engine import ScriptedPolicyEngine

from lego_rl.adapter.canonical import CanonicalRequest, Message
from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.sessions import SessionRegistry, load_turn_records, turn_records_path
from lego_rl.chat.render import ChatRenderer
from lego_rl.errors import LegoError, ProtocolError

ASK = [Message(role="user", content="hello")]


def test_open_get_close_and_rejections() -> None:
    reg = SessionRegistry()
    s = reg.open("r-1", template_kwargs={"reasoning_effort": "low"}, max_requests=3, max_context_tokens=100)
    assert reg.get("r-1") is s and "r-1" in reg and reg.open_ids() == ["r-1"]
    for missing, word in ((None, "no session"), ("", "no session"), ("r-2", "unknown session 'r-2'")):
        with pytest.raises(ProtocolError, match=word) as err:
            reg.get(missing)
        assert err.value.status == 401 and err.value.kind == "authentication_error"
    assert reg.close("r-1") is s and s.state == "closed"
    with pytest.raises(ProtocolError, match="closed session 'r-1'"):
        reg.get("r-1")
    with pytest.raises(ValueError, match="already exists"):
        reg.open("r-1")  # ids are single use, even after closing
    with pytest.raises(ProtocolError, match="closed"):
        s.admit_request()  # a handle kept past close is refused too


def test_ids_built_from_hashed_safe_names_open() -> None:
    # A rollout's session id is safe_name(rollout id) plus a suffix; safe_name would hash such a name again,
    # so the check must be on the characters, not on safe_name(id) == id.
    from lego_rl.runstore import safe_name

    sid = safe_name("collide/1") + "-s0"
    assert SessionRegistry().open(sid).id == sid
    assert SessionRegistry().open("x" * 200).id == "x" * 200
    with pytest.raises(ValueError, match="must be a safe name"):
        SessionRegistry().open("x" * 201)


@pytest.mark.parametrize(
    ("sid", "kw", "needle"),
    [
        ("", {}, "must be a safe name"),
        ("a b", {}, "must be a safe name"),
        ("a/b", {}, "must be a safe name"),
        ("..", {}, "must be a safe name"),
        ("ok", {"max_requests": 0}, "max_requests must be positive, got 0"),
        ("ok", {"max_context_tokens": -5}, "max_context_tokens must be positive, got -5"),
    ],
)
def test_open_rejects_bad_arguments(sid: str, kw: dict[str, int], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        SessionRegistry().open(sid, **kw)  # type: ignore[arg-type]


async def test_sessions_are_isolated(tiny_model_dir: Path, renderer: ChatRenderer) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, lambda prompt, i: f"answer {i}", score=False)
    core = AdapterCore(renderer, engine, max_context_tokens=2048)
    reg = SessionRegistry()
    a, b = reg.open("a"), reg.open("b", template_kwargs={"reasoning_effort": "high"})
    first = await core.run_turn(a, CanonicalRequest(protocol="chat", messages=ASK))
    history = [*ASK, Message(role="assistant", content=first.text), Message(role="user", content="more")]
    # Session b sends a history that extends a's turn: it must not reuse a's ids.
    await core.run_turn(b, CanonicalRequest(protocol="chat", messages=history))
    await core.run_turn(a, CanonicalRequest(protocol="chat", messages=history))
    assert [r.render_mode for r in a.records] == ["full", "bridged"]
    assert [r.render_mode for r in b.records] == ["full"]
    assert {r.session_id for r in a.records} == {"a"} and {r.session_id for r in b.records} == {"b"}
    assert "Reasoning effort: high" in renderer.decode(b.records[0].prompt_ids)
    assert "Reasoning effort" not in renderer.decode(a.records[1].prompt_ids)


async def test_records_saved_on_close_never_overwritten(
    tmp_path: Path, tiny_model_dir: Path, renderer: ChatRenderer
) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["one", "two"], score=False)
    core = AdapterCore(renderer, engine, max_context_tokens=2048)
    reg = SessionRegistry()
    s = reg.open("keep")
    await core.run_turn(s, CanonicalRequest(protocol="responses", messages=ASK))
    await core.run_turn(s, CanonicalRequest(protocol="responses", messages=ASK, side_label="title"))
    assert reg.close("keep", out_dir=tmp_path / "turns") is s
    saved = load_turn_records(turn_records_path(tmp_path / "turns", "keep"))
    assert saved == s.records and [r.kind for r in saved] == ["main", "side"]
    assert sorted(p.name for p in (tmp_path / "turns").iterdir()) == [
        "keep.turns.jsonl"
    ]  # no temp files left

    other = reg.open("clash")
    turn_records_path(tmp_path / "turns", "clash").write_text("precious\n")
    with pytest.raises(FileExistsError, match="turn records .*clash.turns.jsonl already exists"):
        reg.close("clash", out_dir=tmp_path / "turns")
    assert turn_records_path(tmp_path / "turns", "clash").read_text() == "precious\n"
    assert other.state == "open" and reg.get("clash") is other  # a failed save leaves the session open


def test_close_all(tmp_path: Path) -> None:
    reg = SessionRegistry()
    for sid in ("x", "y"):
        reg.open(sid)
    closed = reg.close_all(out_dir=tmp_path)
    assert [s.id for s in closed] == ["x", "y"] and reg.open_ids() == []
    assert all(load_turn_records(turn_records_path(tmp_path, sid)) == [] for sid in ("x", "y"))


def test_load_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.turns.jsonl"
    bad.write_text('{"session_id": "s"}\n')
    with pytest.raises(LegoError, match="bad.turns.jsonl:1: not a valid turn record"):
        load_turn_records(bad)
