"""Turn records that survive a crash: `lego adapter` appends and fsyncs each record as its turn ends, so
``kill -9`` loses nothing answered; a session's failure reason is saved; invalid first requests and
unsafe session ids open nothing; errors, sessions and saves are logged as JSON lines."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.scripted_engine import ScriptedPolicyEngine
from support.standalone_adapter import standalone_adapter
from test_server import GOOD, PROTOCOLS, BrokenEngine

from lego_rl.adapter.sessions import load_turn_records


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages}


async def test_kill_9_mid_run_keeps_every_answered_turn(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["one", "two", "three", "b-one", "never sent"])
    records = tmp_path / "records"
    async with standalone_adapter(engine, tiny_model_dir, records) as adapter:
        url = f"{adapter.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            history: list[dict[str, Any]] = []
            for text in ("hi", "go on", "and more"):
                history.append({"role": "user", "content": text})
                async with http.post(url, json=chat(history), headers={"Authorization": "Bearer run-a"}) as r:
                    assert r.status == 200
                    history.append((await r.json())["choices"][0]["message"])
            async with http.post(url, json=chat([{"role": "user", "content": "b"}]),
                                 headers={"Authorization": "Bearer run-b"}) as r:
                assert r.status == 200
            # Refused before any session exists: a malformed first request, an unsafe id.
            async with http.post(url, data=b'{"messages": [', headers={"Authorization": "Bearer run-c"}) as r:
                assert r.status == 400
            async with http.post(url, json=chat([{"role": "user", "content": "x"}]),
                                 headers={"Authorization": "Bearer .."}) as r:
                assert r.status == 401 and "safe name" in (await r.json())["error"]["message"]
        stderr = await adapter.stop(signal.SIGKILL)  # no shutdown hook runs: what is on disk is all there is
    assert adapter.proc.returncode == -signal.SIGKILL
    a = load_turn_records(records / "run-a.turns.jsonl")
    assert [r.output_ids for r in a] == [c.output_ids for c in engine.calls[:3]]
    assert [r.prompt_ids for r in a] == [c.prompt_ids for c in engine.calls[:3]]
    assert [r.render_mode for r in a] == ["full", "bridged", "bridged"]
    (b,) = load_turn_records(records / "run-b.turns.jsonl")
    assert b.output_ids == engine.calls[3].output_ids
    status = json.loads((records / "run-a.session.json").read_text())
    assert status["state"] == "open" and status["records"] == 3 and status["infra_failure"] is None
    assert sorted(p.name for p in records.iterdir()) == [
        "run-a.session.json", "run-a.turns.jsonl", "run-b.session.json", "run-b.turns.jsonl"]
    events = [json.loads(line[line.index("{"):]) for line in stderr.splitlines() if '{"event"' in line]
    kinds = [e["event"] for e in events]
    assert kinds.count("session_opened") == 2 and kinds.count("records_saved") == 4
    assert [e["status"] for e in events if e["event"] == "error_answer"] == [400, 401]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_failure_reason_is_saved_with_the_session(make_harness, tmp_path: Path, protocol: str) -> None:
    h = await make_harness(backend=BrokenEngine(), records_dir=tmp_path)
    r = await h.client.post(GOOD[protocol][0], json=GOOD[protocol][1], headers={"Authorization": "Bearer sess-a"})
    assert r.status == 502
    status = json.loads((tmp_path / "sess-a.session.json").read_text())
    assert "1 logprobs for 3 output tokens" in status["infra_failure"] and status["termination"] == "infra_failure"
    assert not (tmp_path / "sess-a.turns.jsonl").exists()  # nothing was answered, nothing recorded


async def test_records_are_on_disk_before_the_answer_is_sent(make_harness, tmp_path: Path) -> None:
    h = await make_harness(["first", "second"], records_dir=tmp_path)
    for stream in (False, True):
        body = dict(GOOD["chat"][1], stream=stream)
        r = await h.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sess-a"})
        assert r.status == 200
        await r.read()
        on_disk = load_turn_records(tmp_path / "sess-a.turns.jsonl")
        assert [x.model_dump() for x in on_disk] == [x.model_dump() for x in h.sessions.get("sess-a").records]


def test_unsafe_session_ids_are_refused() -> None:
    from lego_rl.adapter.sessions import SessionRegistry

    registry = SessionRegistry()
    for bad in ("..", ".hidden", "a/b", "a b", "", "x" * 201, "dots."):
        with pytest.raises(ValueError, match="safe name"):
            registry.open(bad)
    assert registry.open("rollout-1.a_b").id == "rollout-1.a_b"
