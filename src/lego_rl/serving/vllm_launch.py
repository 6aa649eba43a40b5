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

* ``--enable-return-routed-experts`` with ``VLLM_USE_V2_MODEL_RUNNER=1`` when ``routed_experts`` is asked
  for (``rollout.use_rollout_routing_replay``, R3): replies then carry each token's experts. vLLM refuses
  it at start-up without model runner V2, for a dense model, or with prefix caching off; runner V2 needs
  Triton, so not on CPU. A vLLM whose argument parser lacks the flag is refused before it is started
  (``vllm_install``; ``lego validate`` reports the same as ``r3_vllm_flag``).

The distribution ``vllm-cpu`` must be started as ``python -m vllm.entrypoints.openai.api_server``.
The sampling mask needs model runner V2 too (``--return-sampling-mask``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from dataclasses import dataclass
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


ROUTED_EXPERTS_FLAG = "--enable-return-routed-experts"

# Run by the vLLM interpreter: its version and the literal flags of its engine argument parser, read from
# the source rather than imported (importing vLLM takes ~20 s here; validate must stay quick).
_PROBE = """
import importlib.metadata as md, importlib.util, json, pathlib, sys
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    print(json.dumps({"error": "no vllm package"})); sys.exit()
root = pathlib.Path(list(spec.submodule_search_locations)[0])
dists = md.packages_distributions().get("vllm") or ["vllm"]
try:
    version = dists[0] + " " + md.version(dists[0])
except md.PackageNotFoundError:
    version = "vllm (version unknown)"
try:
    source = (root / "engine" / "arg_utils.py").read_text()
except OSError as exc:
    print(json.dumps({"error": f"cannot read {root}/engine/arg_utils.py: {exc}"})); sys.exit()
flags = sorted({f for f in sys.argv[1:] if f'"{f}"' in source})
print(json.dumps({"version": version, "root": str(root), "flags": flags}))
"""


@dataclass(frozen=True)
class VllmInstall:
    """What an installed vLLM offers, as far as lego's launch flags go."""

    python: Path
    version: str
    """Distribution and version, e.g. ``vllm-cpu 0.32.0``."""
    flags: frozenset[str]
    """Those of the asked-for flags its argument parser defines."""


def vllm_install(python: Path | None = None, *, flags: tuple[str, ...] = (ROUTED_EXPERTS_FLAG,)) -> VllmInstall:
    """Version and known ``flags`` of the vLLM under ``python`` (default ``vllm_python()``); ``ConfigError``
    when there is no interpreter or no vLLM package there."""
    python = python or vllm_python()
    if not python.exists():
        raise ConfigError(f"no vLLM interpreter at {python}; run scripts/setup_vllm.sh or set LEGO_VLLM_PYTHON",
                          parameter="LEGO_VLLM_PYTHON", value=str(python))
    try:
        proc = subprocess.run([str(python), "-c", _PROBE, *flags], capture_output=True, text=True, timeout=60)
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise ConfigError(f"could not ask {python} about its vLLM: {exc}", parameter="LEGO_VLLM_PYTHON",
                          value=str(python)) from None
    if not isinstance(answer, dict) or "error" in answer:
        why = answer.get("error") if isinstance(answer, dict) else f"exit {proc.returncode}: {proc.stderr[-300:]}"
        raise ConfigError(f"{python} has no usable vLLM ({why})", parameter="LEGO_VLLM_PYTHON", value=str(python))
    return VllmInstall(python, str(answer["version"]), frozenset(answer["flags"]))


def require_routed_experts(install: VllmInstall) -> None:
    """Refuse a vLLM that cannot return routed experts, naming its version and the remedy."""
    if ROUTED_EXPERTS_FLAG not in install.flags:
        raise ConfigError(
            f"rollout.use_rollout_routing_replay (R3) needs vLLM's {ROUTED_EXPERTS_FLAG}, which {install.version} "
            f"at {install.python} does not have: install a vLLM that has it (0.21 or later) or turn R3 off",
            parameter="rollout.use_rollout_routing_replay", value=install.version)


def vllm_command(model_dir: Path, *, port: int, host: str = "127.0.0.1", python: Path | None = None,
                 max_model_len: int = 65536, name: str = "tiny", cpu: bool = True,
                 routed_experts: bool = False, extra: list[str] | None = None) -> list[str]:
    """The command line lego uses to serve ``model_dir`` with vLLM (``routed_experts``: R3 on)."""
    cmd = [str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--served-model-name", name, "--host", host, "--port", str(port),
           "--max-model-len", str(max_model_len), "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs"]
    if cpu:
        cmd += ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1"]
    if routed_experts:
        cmd.append(ROUTED_EXPERTS_FLAG)
    return cmd + list(extra or [])


class VllmServer:
    """A vLLM subprocess on 127.0.0.1; ``async with`` waits for ``/health`` and kills its process group."""

    def __init__(self, model_dir: Path, *, port: int, log_path: Path, ready_timeout_s: float = 300.0,
                 **kw: object) -> None:
        self.port, self.log_path, self.ready_timeout_s = port, log_path, ready_timeout_s
        self.routed_experts = bool(kw.get("routed_experts", False))
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
        if self.routed_experts:
            # Before spawning: an unknown flag would only show as an argparse error in the log.
            require_routed_experts(await asyncio.to_thread(vllm_install, Path(self.cmd[0])))
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # vLLM returns routed experts from runner V2 only
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
