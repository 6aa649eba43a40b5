"""rollout-check's baseline reports through events and a callback, and prints nothing itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lego_rl.config.resolve import resolve
from lego_rl.compose.sessions.check_session import RolloutCheckSession
from lego_rl.runstore import read_events
from lego_rl.runstore.events import Baseline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.mark.root
async def test_baseline_verdicts_go_to_the_log_and_the_callback_not_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = resolve(
        environ={},
        overrides=[
            f"rollout.prompt_data={json.dumps(str(EXAMPLES / 'tasks.jsonl'))}",
            f"sandbox.images={json.dumps(str(EXAMPLES / 'images.json'))}",
            'sandbox.provider="bwrap"',
            'sandbox.network="none"',
            f"paths.run_root={json.dumps(str(tmp_path / 'run'))}",
        ],
    )
    session = RolloutCheckSession(r, ids=["lego-example-median"])
    heard: list[Baseline] = []
    try:
        passing = await session.baseline(on_result=heard.append)
    finally:
        session.run_dir.close()
    assert passing == []
    assert [(b.instance_id, b.solved, b.error) for b in heard] == [("lego-example-median", False, None)]
    logged = [e for e in read_events(tmp_path / "run" / "events.jsonl") if isinstance(e, Baseline)]
    assert logged == heard
    assert capsys.readouterr() == ("", "")
