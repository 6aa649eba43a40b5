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
