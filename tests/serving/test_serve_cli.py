"""`lego serve` as an operator runs it: a real process, answering generate, stopping cleanly on SIGINT."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lego_rl.serving.server import free_port

pytestmark = pytest.mark.slow


def test_lego_serve_answers_generate_and_stops(tiny_model: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-c", "from lego_rl.cli.main import main; main()", "serve", "--model",
           "lego:tiny", "--port", str(port), "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "lego serve did not become healthy"
            time.sleep(0.3)
        body = json.dumps({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3, "logprobs": 0}}).encode()
        req = urllib.request.Request(base + "/inference/v1/generate", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            reply = json.loads(r.read())
        assert len(reply["choices"][0]["token_ids"]) == 3
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0


def test_lego_serve_rejects_missing_model(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lego_rl.cli.main import app

    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "not a model directory" in " ".join(result.output.split())
