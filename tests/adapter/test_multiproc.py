"""`lego adapter --workers N`: several adapter processes behind one port, each session held by one.

Real processes throughout (the front, its workers, the CLI entry point) over a scripted policy engine
(TEST DOUBLE at the model boundary, served over HTTP).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from support.scripted_engine import ScriptedPolicyEngine

from lego_rl.adapter.multiproc import session_key
from lego_rl.adapter.sessions import load_turn_records
from lego_rl.adapter.standalone import owner
from lego_rl.cli.console import EXIT_INFRA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_owner_is_fixed_and_spreads_sessions() -> None:
    keys = [f"rollout-{i}" for i in range(2000)]
    assert [owner(k, 4) for k in keys] == [owner(k, 4) for k in keys]
    counts = [sum(owner(k, 4) == w for k in keys) for w in range(4)]
    assert min(counts) > 400, counts
    assert {owner(k, 1) for k in keys} == {0}


def test_session_key_follows_the_servers_rule() -> None:
    assert session_key("/s/abc/v1/messages", {"Authorization": "Bearer other"}) == "abc"
    assert session_key("/v1/messages", {"Authorization": "Bearer tok"}) == "tok"
    assert session_key("/v1/responses", {"x-api-key": "key-1"}) == "key-1"
    assert session_key("/v1/responses", {}) is None
    assert session_key("/s/", {"x-api-key": "k"}) == "k"


class Adapter:
    """A `lego adapter --workers 2` process over a scripted engine served on HTTP."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, records: Path) -> None:
        self.proc, self.url, self.records = proc, url, records

    @staticmethod
    async def start(model: Path, engine_url: str, records: Path, *extra: str) -> Adapter:
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("lego")), "adapter", "--serving-url", engine_url, "--model",
            str(model), "--open-sessions", str(records), "--port", str(port), "--workers", "2", *extra,
            stderr=asyncio.subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for _ in range(3000):  # three processes import transformers: slow on a loaded machine
                assert proc.returncode is None, (await proc.communicate())[1].decode()[-3000:]
                try:
                    async with http.get(f"{url}/health") as r:
                        if r.status == 200:
                            return Adapter(proc, url, records)
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError("lego adapter --workers 2 did not come up")


async def two_turns(http: aiohttp.ClientSession, url: str, sid: str, *, by_path: bool, stream: bool) -> None:
    """A Chat Completions conversation of two turns; the second extends the first answer (bridgeable)."""
    base, headers = (f"{url}/s/{sid}", {"Authorization": "Bearer ignored"}) if by_path else \
        (url, {"Authorization": f"Bearer {sid}"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"hello from {sid}"}]
    for turn in range(2):
        async with http.post(f"{base}/v1/chat/completions", headers=headers,
                             json={"model": "m", "messages": messages, "stream": stream}) as r:
            assert r.status == 200, await r.text()
            text = await r.text()
        if stream:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        else:
            content = json.loads(text)["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"more {turn}"}]


async def test_sessions_stick_to_one_worker_and_records_are_saved(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, lambda prompt, i: f"Answer {i}.", score=False)
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    engine_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    sids = [f"sess-{i}" for i in range(8)]
    adapter = await Adapter.start(tiny_model_dir, f"http://127.0.0.1:{engine_port}", tmp_path / "records",
                                  "--max-body-mb", "1")
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(two_turns(http, adapter.url, sid, by_path=i % 2 == 0, stream=i % 3 == 0)
                                   for i, sid in enumerate(sids)))
            async with http.get(f"{adapter.url}/health") as r:
                health = await r.json()
            # A body over the limit is forwarded as it comes, Content-Length kept: the worker's own 413.
            big = {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
            async with http.post(f"{adapter.url}/v1/chat/completions", json=big,
                                 headers={"Authorization": "Bearer sess-big"}) as r:
                assert r.status == 413
                refusal = await r.json()
    finally:
        adapter.proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(adapter.proc.communicate(), 120)
        await runner.cleanup()
    assert adapter.proc.returncode == 0, stderr.decode()[-3000:]
    assert health["open_sessions"] == 8 and len(health["workers"]) == 2
    assert "lego adapter --max-body-mb" in refusal["error"]["message"]
    pids: dict[int, set[int]] = {0: set(), 1: set()}
    for sid in sids:
        records = load_turn_records(tmp_path / "records" / f"{sid}.turns.jsonl")
        # The second turn was bridged from the first: the same process held the session's chain.
        assert [r.render_mode for r in records] == ["full", "bridged"], sid
        status = json.loads((tmp_path / "records" / f"{sid}.session.json").read_text())
        assert status["state"] == "closed" and status["records"] == 2
        pids[owner(sid, 2)].add(status["pid"])
    assert len(pids[0]) == len(pids[1]) == 1 and pids[0] != pids[1], pids  # one process per worker, two workers
    assert not (tmp_path / "records" / "sess-big.turns.jsonl").exists()


async def test_a_dead_worker_stops_the_adapter_and_answered_turns_are_kept(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    engine = ScriptedPolicyEngine(tiny_model_dir, ["Fine."], score=False)
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    engine_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    adapter = await Adapter.start(tiny_model_dir, f"http://127.0.0.1:{engine_port}", tmp_path / "records")
    try:
        async with aiohttp.ClientSession() as http:
            await two_turns(http, adapter.url, "victim", by_path=False, stream=False)
        status = json.loads((tmp_path / "records" / "victim.session.json").read_text())
        os.kill(status["pid"], signal.SIGKILL)
        _, stderr = await asyncio.wait_for(adapter.proc.communicate(), 120)
    finally:
        if adapter.proc.returncode is None:
            adapter.proc.kill()
            await adapter.proc.wait()
        await runner.cleanup()
    assert adapter.proc.returncode == EXIT_INFRA, stderr.decode()[-3000:]
    assert '"event": "worker_died"' in stderr.decode()
    assert len(load_turn_records(tmp_path / "records" / "victim.turns.jsonl")) == 2


async def test_workers_stop_when_the_front_is_killed(tiny_model_dir: Path, tmp_path: Path) -> None:
    """kill -9 of the front cannot run its clean-up: the workers notice and stop on their own."""
    engine = ScriptedPolicyEngine(tiny_model_dir, ["Fine."], score=False)
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    engine_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", engine_port).start()
    adapter = await Adapter.start(tiny_model_dir, f"http://127.0.0.1:{engine_port}", tmp_path / "records")
    try:
        async with aiohttp.ClientSession() as http:
            await two_turns(http, adapter.url, "left", by_path=False, stream=False)
        worker = json.loads((tmp_path / "records" / "left.session.json").read_text())["pid"]
        adapter.proc.kill()
        await adapter.proc.wait()
        for _ in range(600):
            if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
                break
            await asyncio.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError(f"worker {worker} outlived its front by 60 s")
    finally:
        await runner.cleanup()
    status = json.loads((tmp_path / "records" / "left.session.json").read_text())
    assert status["state"] == "closed" and status["records"] == 2  # stopped cleanly, sessions saved
