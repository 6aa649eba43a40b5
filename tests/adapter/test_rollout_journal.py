"""The rollout path's turn records survive a crash: a session opened with ``records_dir`` (a rollout's
folder) has each record appended and fsynced there by the serving stack's adapter before the answer is
sent; ``close(out_dir=records_dir)`` appends the rest to the same file."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support.scripted_engine import ScriptedPolicyEngine
from support.standalone_adapter import free_port

from lego_rl.adapter.sessions import SessionRegistry, append_records, load_turn_records
from lego_rl.trajectory.records import TurnRecord

# The trainer side of a rollout, reduced to what owns the adapter: the real serving stack (lego.toml
# config, ServingClient to an external engine, AdapterServer) and a session opened the way rollouts do.
TRAINER = """
import asyncio, json, sys
from pathlib import Path
from lego_rl.config.resolve import resolve
from lego_rl.compose.stack import serving_stack

async def main(engine_url: str, model: str, folder: str) -> None:
    cfg = resolve(environ={}, overrides=["serving.backend=vllm", f"serving.urls=['{engine_url}']",
                                         f"model.checkpoint={model}", "adapter.port=0"]).config
    async with serving_stack(cfg) as stack:
        stack.sessions.open("rollout-7", records_dir=Path(folder))
        print(json.dumps({"url": stack.adapter_url}), flush=True)
        await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_kill_9_of_the_trainer_keeps_the_rollouts_answered_turns(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["one", "two", "three"])
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    engine_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    folder = tmp_path / "rollouts" / "rollout-7"
    folder.mkdir(parents=True)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", TRAINER, f"http://127.0.0.1:{engine_port}",
                                                str(tiny_model_dir), str(folder), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 300)
        assert line, (await proc.communicate())[1].decode()[-3000:]
        url = json.loads(line)["url"] + "/v1/chat/completions"
        history: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http:
            for text in ("hi", "go on", "and more"):
                history.append({"role": "user", "content": text})
                async with http.post(url, json={"model": "m", "messages": history},
                                     headers={"Authorization": "Bearer rollout-7"}) as r:
                    assert r.status == 200, await r.text()
                    history.append((await r.json())["choices"][0]["message"])
                # Answered means on disk: the record is there before the next request is even sent.
                assert len(load_turn_records(folder / "rollout-7.turns.jsonl")) == len(engine.calls)
    finally:
        proc.send_signal(signal.SIGKILL)  # the trainer dies: no close, no shutdown hook
        await asyncio.wait_for(proc.communicate(), 60)
        await runner.cleanup()
    assert proc.returncode == -signal.SIGKILL
    saved = load_turn_records(folder / "rollout-7.turns.jsonl")
    assert [r.prompt_ids for r in saved] == [c.prompt_ids for c in engine.calls]
    assert [r.output_ids for r in saved] == [c.output_ids for c in engine.calls]
    assert [r.logprobs for r in saved] == [c.logprobs for c in engine.calls]
    assert [r.render_mode for r in saved] == ["full", "bridged", "bridged"]
    status = json.loads((folder / "rollout-7.session.json").read_text())
    assert status["state"] == "open" and status["records"] == 3 and status["infra_failure"] is None


def record(sid: str, turn: int) -> TurnRecord:
    return TurnRecord(session_id=sid, turn=turn, kind="main", protocol="chat", prompt_ids=[1, 2, turn],
                      output_ids=[3], logprobs=[-0.5], render_mode="full", finish_reason="stop", stop_reason="end_turn")


def test_close_appends_the_rest_to_the_journal(tmp_path: Path) -> None:
    registry = SessionRegistry()
    session = registry.open("r-1", records_dir=tmp_path)
    session.records += [record("r-1", 0), record("r-1", 1)]
    assert [r.turn for r in append_records(session, tmp_path)] == [0, 1]
    session.records.append(record("r-1", 2))
    registry.close("r-1", out_dir=tmp_path)
    assert [r.turn for r in load_turn_records(tmp_path / "r-1.turns.jsonl")] == [0, 1, 2]
    assert json.loads((tmp_path / "r-1.session.json").read_text())["state"] == "closed"


def test_a_session_with_no_turns_still_leaves_an_empty_records_file(tmp_path: Path) -> None:
    registry = SessionRegistry()
    registry.open("r-0", records_dir=tmp_path)
    registry.close("r-0", out_dir=tmp_path)
    assert load_turn_records(tmp_path / "r-0.turns.jsonl") == []


def test_an_existing_records_file_is_never_appended_to(tmp_path: Path) -> None:
    (tmp_path / "r-2.turns.jsonl").write_text("another run's records\n")
    session = SessionRegistry().open("r-2", records_dir=tmp_path)
    session.records.append(record("r-2", 0))
    with pytest.raises(FileExistsError):
        append_records(session, tmp_path)
    assert (tmp_path / "r-2.turns.jsonl").read_text() == "another run's records\n"
    assert session.journaled == 0


def test_a_sync_racing_close_writes_each_record_once(tmp_path: Path) -> None:
    """A CLI cut off mid-turn: the edge's sync (worker thread) and the rollout's close meet."""
    for attempt in range(20):
        registry = SessionRegistry()
        sid = f"race-{attempt}"
        session = registry.open(sid, records_dir=tmp_path)
        session.records += [record(sid, t) for t in range(50)]
        syncer = threading.Thread(target=append_records, args=(session, tmp_path))
        syncer.start()
        registry.close(sid, out_dir=tmp_path)
        syncer.join()
        assert [r.turn for r in load_turn_records(tmp_path / f"{sid}.turns.jsonl")] == list(range(50))
