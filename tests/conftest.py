"""Suite-wide guards. Tests run as root against real sandboxes; a bug that reaches the host (a sandbox
write that escapes its overlay, a host-side extraction over /tmp) must fail the test that did it, not a
later, unrelated one."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import pytest

_SHARED_DIRS = {"/tmp": 0o1777, "/var/tmp": 0o1777}


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
