"""The embedded engine's port: a fixed port another process listens on is refused before the model loads,
naming the address (two runs at the default port 0: tests/cli/test_train_cmd.py)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from lego_rl.serving.errors import ListenFailed
from lego_rl.serving.server import EmbeddedServer


def test_a_taken_port_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # No model at this path: had start() loaded it first, the error would be a missing file.
        server = EmbeddedServer(tmp_path / "no-model", host="127.0.0.1", port=port)
        with pytest.raises(ListenFailed, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            asyncio.run(server.start())
        assert server.engine is None and server.port == port
