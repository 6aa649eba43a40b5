"""Suite-wide guards. Tests run as root against real sandboxes; a bug that reaches the host (a sandbox
write that escapes its overlay, a host-side extraction over /tmp) must fail the test that did it, not a
later, unrelated one."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterator

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite in several pytest-xdist workers on a machine of a few cores. A worker's torch (and
    # every process it starts: lego train, torchrun ranks, the engine) would otherwise use one OpenMP thread per
    # core, and OpenMP threads that spin at barriers while the other workers hold the cores make a step tens of
    # times slower. One thread per process keeps the workers from starving each other; set before torch loads.
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    # xdist hands its workers the controller's terminal width as COLUMNS (80 without a terminal); lego's
    # consoles honour an operator's COLUMNS and would fold every message the CLI tests read at 80 columns,
    # where a serial run (no COLUMNS) does not. The tests expect what a log or pipe gets: no folding.
    os.environ.pop("COLUMNS", None)
    # Each worker gets its own sunabako node state: tests list a node's sandboxes to prove they left none, and a
    # session's teardown deletes what appeared on its node, so two workers on one node would see (and delete)
    # each other's sandboxes. Read by the test helpers at import, hence here, before any test module loads.
    for _var, _default in (("LEGO_SUNABAKO_TEST_STATE", "/var/lib/lego-rl/sunabako-test"),
                           ("LEGO_SUNABAKO_ROLLOUT_STATE", "/var/lib/lego-rl/sunabako-rollout-test")):
        os.environ[_var] = f"{os.environ.get(_var, _default)}-{os.environ['PYTEST_XDIST_WORKER']}"

_SHARED_DIRS = {"/tmp": 0o1777, "/var/tmp": 0o1777}

LOW_DISK_BYTES = 2 << 30
"""Below this much free space where tests write, say so in the progress output. The suite's sandboxes, rootfs
clones and toolchain unpack need a few GB; on a full disk every later test errs in tmp_path's setup, which
reads like a broken product unless the log says why."""


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def pytest_report_header(config: pytest.Config) -> str:
    return f"free disk: {_free_bytes(tempfile.gettempdir()) / 2**30:.1f} GiB under {tempfile.gettempdir()}"


_low_disk_reported = False


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    global _low_disk_reported
    free = _free_bytes(tempfile.gettempdir())
    if free < LOW_DISK_BYTES and not _low_disk_reported:
        _low_disk_reported = True
        # The progress line of -q hides warnings until the end (which a CI timeout never reaches): print now.
        print(f"\nLOW DISK after {nodeid}: {free / 2**20:.0f} MiB free under {tempfile.gettempdir()}",
              file=sys.stderr, flush=True)


@pytest.fixture(autouse=True)
def _host_shared_dirs_untouched() -> Iterator[None]:
    yield
    changed = {d: oct(stat.S_IMODE(os.stat(d).st_mode)) for d, mode in _SHARED_DIRS.items()
               if stat.S_IMODE(os.stat(d).st_mode) != mode}
    for d in changed:
        os.chmod(d, _SHARED_DIRS[d])  # put it back so the rest of the suite is not poisoned
    assert not changed, f"this test changed the mode of host directories: {changed}"


CLONE_NEWNET = 0x40000000
_HOST_NETNS = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
"""The network namespace this session started in, opened before any test cages the session (tests/rollout
moves the main thread into a loopback-only namespace for the rest of the session)."""


@pytest.fixture
def host_network() -> Iterator[None]:
    """Run the test in the session's original network namespace, whatever ran before it; restored after.
    For tests about what a sandbox can reach of the machine's real network (egress)."""
    import ctypes

    here = "/proc/thread-self/ns/net"
    if os.stat(here).st_ino == os.fstat(_HOST_NETNS).st_ino:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    current = os.open(here, os.O_RDONLY)
    try:
        if libc.setns(_HOST_NETNS, CLONE_NEWNET) != 0:
            pytest.fail(f"cannot return to the session's network namespace: {os.strerror(ctypes.get_errno())}")
        yield
    finally:
        libc.setns(current, CLONE_NEWNET)
        os.close(current)


# Modules whose tests share one expensive module-scoped fixture. Under pytest-xdist (`make test`) each worker that
# ran one of their tests would build the fixture again (a vLLM server takes a minute and GBs to start on two
# cores; torchrun ranks, a recorded training run, a 10k-rollout run), so each such module runs on one worker
# (`--dist loadgroup`); every other test goes to whichever worker is free.
_ONE_WORKER_MODULES = {
    "tests/serving/test_vllm.py": "a vLLM server",
    "tests/serving/test_vllm_sync.py": "a vLLM server",
    "tests/chat/test_parser_conformance.py": "vLLM's parsers run once over the corpus",
    "tests/train/test_megatron_ep.py": "torchrun ranks of an expert-parallel model",
    "tests/train/test_megatron_moe.py": "a Megatron and a torch backend replaying routes",
    "tests/train/test_routing_replay.py": "a replaying backend",
    "tests/compose/test_audit.py": "a recorded training run",
    "tests/monitor/test_large_run.py": "a synthetic run of thousands of rollouts",
    "tests/swe/test_grader_suspect_and_reset.py": "a task image",
    "tests/images/test_images_import.py": "imported image sources",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module in _ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
