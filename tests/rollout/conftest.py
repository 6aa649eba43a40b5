"""Fixtures for generate() tests: real bwrap sandboxes, real CLIs, a real adapter, caged networking.

* The whole test process moves into a **loopback-only network namespace** for the session
  (``unshare(CLONE_NEWNET)`` on the event-loop thread, ``lo`` up, the original namespace restored at the
  end). Sandboxes use ``network="host"``, i.e. this namespace: the CLIs reach the adapter on 127.0.0.1
  and nothing else.
* ``scripted_stack``: the adapter (real ``AdapterServer`` + ``AdapterCore`` + ``ServingClient`` over HTTP)
  in front of ``ScriptedPolicyEngine``, the TEST DOUBLE at the model boundary (tests/support).
* ``rollout_ctx``: a ``RolloutContext`` over a fresh run directory, the example tasks and the fetched
  toolchain.
* ``sunabako_node``: a real local sunabako node (native runtime, test memory mode) with a state dir of
  its own (``$LEGO_SUNABAKO_ROLLOUT_STATE``, default /var/lib/lego-rl/sunabako-rollout-test; the provider
  initialises it), so "nothing of ours left" is checkable with ``sunabako list`` while other test runs
  use their nodes.

Needs root, bubblewrap, the rootfs of scripts/build_rootfs.sh and the toolchain of
scripts/setup_toolchain.sh (``lego toolchain fetch``); the sunabako cases also the sunabako binary (the
``sunabako`` extra). A missing piece fails the test naming the script; ``LEGO_SKIP_MISSING_SETUP=1``
turns that into a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `support` helpers

from support.scripted_engine import ScriptedPolicyEngine

from lego_rl.adapter.core import AdapterCore
from lego_rl.adapter.server import AdapterServer
from lego_rl.adapter.sessions import SessionRegistry
from lego_rl.harness.plugins import get_harness, get_plugin_manager
from lego_rl.harness.toolchain import Toolchain
from lego_rl.images.importer import load_images_json
from lego_rl.rollout.generate import RolloutContext, RolloutSpec
from lego_rl.rollout.ports import AdapterSessions
from lego_rl.rollout.settings import RolloutSettings
from lego_rl.runstore import RunDir
from lego_rl.serving.client import ServingClient
from lego_rl.tasks.model import TaskRow
from lego_rl.tasks.rows import load_tasks

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
ROOTFS = Path(os.environ.get("LEGO_ROOTFS_CACHE", "/var/cache/lego-rl/rootfs-bookworm"))
TOOLCHAIN = Path(os.environ.get("LEGO_TOOLCHAIN_DIR") or REPO / ".lego" / "toolchain")
CLONE_NEWNET = 0x40000000
# Not under pytest's tmp dir or /root: sunabako's chroot fails below a root-only (0700) directory.
SUNABAKO_ROLLOUT_STATE = os.environ.get(
    "LEGO_SUNABAKO_ROLLOUT_STATE", "/var/lib/lego-rl/sunabako-rollout-test"
)


def missing(reason: str) -> None:
    if os.environ.get("LEGO_SKIP_MISSING_SETUP") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set LEGO_SKIP_MISSING_SETUP=1 to skip instead)")


# -- the network cage --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def loopback_only_network() -> Iterator[None]:
    """Move this process's main thread (where the event loop, bwrap and every socket live) into a new,
    loopback-only network namespace for the whole session; restore the original one afterwards."""
    if os.geteuid() != 0:
        missing("rollout tests need root (bubblewrap sandboxes, a private network namespace)")
    libc = ctypes.CDLL(None, use_errno=True)
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:
        os.close(original)
        pytest.fail(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    try:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        yield
    finally:
        libc.setns(original, CLONE_NEWNET)
        os.close(original)


def interfaces() -> list[str]:
    """Network interfaces visible to this thread (inside the cage: only ``lo``)."""
    out = subprocess.run(["ip", "-o", "link"], check=True, capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


# -- set-up checks -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def toolchain(loopback_only_network: None) -> Toolchain:
    """The fetched harness toolchain; Claude Code's and Codex's default pins must be in it."""
    if shutil.which("bwrap") is None:
        missing("bubblewrap is not installed (apt-get install bubblewrap)")
    if not (ROOTFS / ".lego-rootfs-stamp").is_file():
        missing(f"no sandbox rootfs at {ROOTFS}: run scripts/build_rootfs.sh")
    if not (TOOLCHAIN / "toolchain.lock.json").is_file():
        missing(f"no harness toolchain at {TOOLCHAIN}: run scripts/setup_toolchain.sh (lego toolchain fetch)")
    tc = Toolchain(TOOLCHAIN)
    lock = tc.lockfile().entries
    pm = get_plugin_manager({})
    for name in ("claude_code", "codex"):
        absent = [p.key for p in get_harness(name, environ={}, pm=pm).toolchain_pins() if p.key not in lock]
        if absent:
            missing(f"the toolchain at {TOOLCHAIN} lacks {absent}: run scripts/setup_toolchain.sh")
    return tc


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from lego_rl.serving.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def renderer(tiny_model_dir: Path) -> Any:
    from lego_rl.chat.render import ChatRenderer

    return ChatRenderer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def example_rows() -> dict[str, TaskRow]:
    loaded = load_tasks(EXAMPLES / "tasks.jsonl")
    return {row.metadata.instance_id: row for row in loaded.rows}


@dataclass
class SunabakoNode:
    """A local sunabako node for rollout tests: the provider options and a way to list its sandboxes."""

    binary: str
    state_dir: str

    @property
    def provider_options(self) -> dict[str, Any]:
        # The provider initialises the node (uid range for the guest user, unbounded test memory) when
        # node.json is missing: no set-up script needed beyond the binary and the rootfs.
        return {"state_dir": self.state_dir, "allow_test_memory": True, "binary": self.binary}

    def sandbox_ids(self) -> set[str]:
        """Ids of every sandbox the node knows about, in any state (``sunabako list``)."""
        if not Path(self.state_dir, "node.json").exists():
            return set()
        out = subprocess.run(
            [self.binary, "--state", self.state_dir, "list"], check=True, capture_output=True, text=True
        ).stdout
        return _record_ids(out)

    @contextlib.asynccontextmanager
    async def watch(self, every_s: float = 0.1) -> AsyncIterator[set[str]]:
        """Collect the ids of the node's sandboxes seen *running* while the block runs: proof of which
        provider ran (a create that failed and was retried never shows as running). ``list`` takes ~1 ms."""
        seen: set[str] = set()

        async def poll() -> None:
            while True:
                proc = await asyncio.create_subprocess_exec(
                    self.binary, "--state", self.state_dir, "list",
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    out, _ = await proc.communicate()
                except asyncio.CancelledError:
                    await proc.wait()  # `list` is quick: reap it rather than leave it running
                    raise
                if proc.returncode == 0:
                    seen.update(_record_ids(out.decode(), state="running"))
                await asyncio.sleep(every_s)

        task = asyncio.create_task(poll())
        try:
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _record_ids(listing: str, state: str | None = None) -> set[str]:
    """Sandbox ids in a ``sunabako list`` answer, only those in ``state`` when given."""
    return {
        str((record.get("spec") or {}).get("id"))
        for record in json.loads(listing)
        if state is None or (record.get("status") or {}).get("state") == state
    }


@pytest.fixture(scope="session")
def sunabako_node(toolchain: Toolchain) -> Iterator[SunabakoNode]:
    """The node; at the end of the session, whatever a failed test left on it is stopped and deleted
    (the tests themselves assert that generate() left nothing: this only keeps a failure from leaking)."""
    binary = shutil.which("sunabako") or str(Path(sys.executable).with_name("sunabako"))
    if not Path(binary).exists():
        missing("the sunabako binary is not installed (pip install 'lego-rl[sunabako]')")
    Path(SUNABAKO_ROLLOUT_STATE).parent.mkdir(parents=True, exist_ok=True)
    node = SunabakoNode(binary, SUNABAKO_ROLLOUT_STATE)
    before = node.sandbox_ids()
    yield node
    for sandbox_id in sorted(node.sandbox_ids() - before):
        for verb in ("stop", "delete"):
            subprocess.run(  # best effort: the failing test already reported the leak
                [binary, "--state", node.state_dir, verb, sandbox_id],
                check=False,
                capture_output=True,
                timeout=120,
            )


# -- the adapter in front of the scripted policy ----------------------------------------------------


@dataclass
class ScriptedStack:
    sessions: SessionRegistry
    url: str
    engine: ScriptedPolicyEngine
    engine_runner: web.AppRunner
    core: AdapterCore
    extra: list[Any] = field(default_factory=list)

    async def stop_engine(self) -> None:
        """The engine stops answering: its HTTP server goes away (connections refused from now on)."""
        await self.engine_runner.cleanup()


async def _listen(app: web.Application, cleanups: list[Callable[[], Any]]) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    cleanups.append(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def scripted_stack(tiny_model_dir: Path, renderer: Any) -> AsyncIterator[Callable[..., Any]]:
    """Start ``ScriptedPolicyEngine(script)`` over HTTP, a real ServingClient to it, and the adapter."""
    cleanups: list[Callable[[], Any]] = []

    async def start(
        script: Sequence[str] | Callable[[str, int], str],
        *,
        context_limit: int = 60000,
        max_response_tokens: int = 1024,
        retry_deadline_s: float = 30.0,
        score: bool = True,
    ) -> ScriptedStack:
        # score=False (logprob 0.0 everywhere) where a test is about control flow, not numbers: scoring a
        # 9k-token prompt with the tiny model takes seconds of the two shared cores.
        engine = ScriptedPolicyEngine(tiny_model_dir, script, score=score)
        engine_runner, engine_url = await _listen(engine.app(), cleanups)
        client = ServingClient(
            [engine_url], vocab_size=renderer.vocab_size, retry_deadline_s=retry_deadline_s
        )
        cleanups.append(client.close)
        sessions = SessionRegistry()
        core = AdapterCore(
            renderer, client, max_context_tokens=context_limit, max_response_tokens=max_response_tokens
        )
        _, url = await _listen(AdapterServer(core, sessions).app(), cleanups)
        return ScriptedStack(sessions, url, engine, engine_runner, core)

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


def settings_for_tests(**overrides: Any) -> RolloutSettings:
    """RolloutSettings from the config's defaults (through the real projection), sized for tests.

    ``provider``, ``grader_provider``, ``provider_options`` and ``sandbox_options`` describe the sandboxes;
    every other keyword overrides a RolloutSettings field.
    """
    from lego_rl.config.resolve import resolve
    from lego_rl.compose.rollout_check import settings_from_config
    from lego_rl.swe.task_sandbox import SandboxTarget

    provider = overrides.pop("provider", "bwrap")
    grader_provider = overrides.pop("grader_provider", None) or provider
    provider_options = overrides.pop("provider_options", {})
    sandbox_options = overrides.pop("sandbox_options", {"network": "host"})
    fields: dict[str, Any] = {
        "agent_time_budget_s": 180.0,
        "grader_timeout_s": 60.0,
        "guard_s": 420.0,
        "max_turns": 6,
        "max_context_tokens": 60000,
        "max_response_tokens": 1024,
        "agent_sandbox": SandboxTarget(provider, provider_options, sandbox_options),
        "grader_sandbox": SandboxTarget(grader_provider, provider_options, sandbox_options),
        **overrides,
    }
    return dataclasses.replace(settings_from_config(resolve(environ={})), **fields)


def make_context(
    run_root: Path,
    sessions: AdapterSessions,
    adapter_url: str,
    toolchain: Toolchain,
    *,
    environ: dict[str, str] | None = None,
    harness_for: Callable[[str], Any] | None = None,
    **settings: Any,
) -> RolloutContext:
    """A RolloutContext over the example tasks; ``settings`` as for ``settings_for_tests``."""
    env = dict(environ or {})
    pm = get_plugin_manager(env)
    return RolloutContext(
        settings=settings_for_tests(**settings),
        run=RunDir.open(run_root, config={"test": True}),
        sessions=sessions,
        adapter_url=adapter_url,
        harness_for=harness_for or (lambda name: get_harness(name, environ=env, pm=pm)),
        toolchain=toolchain,
        images=load_images_json(EXAMPLES / "images.json"),
        dataset_dir=EXAMPLES,
    )


def spec_for(row: TaskRow, harness: str, rollout_id: str | None = None) -> RolloutSpec:
    row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"agent": harness})})
    return RolloutSpec(row=row, rollout_id=rollout_id or f"{row.metadata.instance_id}-{harness}")


# -- nothing left running ----------------------------------------------------------------------------


def descendants(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command name) of every live descendant of ``pid`` (default: this process)."""
    root = pid or os.getpid()
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        parent[int(entry)], names[int(entry)] = int(fields[1]), name
    found = []
    for p in parent:
        q = p
        while q in parent and q != root and q > 1:
            q = parent[q]
        if q == root and p != root:
            found.append((p, names[p]))
    return found


def assert_nothing_running(sessions: SessionRegistry | None = None) -> None:
    """No child process of ours, no bwrap sandbox state of ours, no open adapter session."""
    from lego_rl.sandbox.bwrap_state import DEFAULT_STATE_ROOT, list_state

    left = descendants()
    assert not left, f"processes left running: {left}"
    ours = [e.id for e in list_state(DEFAULT_STATE_ROOT) if e.owner_pid == os.getpid()]
    assert not ours, f"bwrap sandboxes left behind: {ours}"
    if sessions is not None:
        assert sessions.open_ids() == [], f"adapter sessions left open: {sessions.open_ids()}"
