"""An asyncio event loop on a virtual clock: ``asyncio.sleep(600)`` returns at once, with ``loop.time()``
600 s later. For code that only waits on timers and on other coroutines (the rollout scheduler driven by
timed test doubles): an hour of simulated rollouts runs in well under a second, deterministically.

When nothing is ready, the loop's selector is asked to wait until the next timer; this one answers at once
and moves the clock to that timer instead. Real I/O still works (it is polled without waiting), but a
coroutine waiting on a thread or a socket with no timer pending is a deadlock here, and says so.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            if not ready and timeout is None:
                raise RuntimeError("virtual clock: every task waits and no timer is pending (a deadlock, or a "
                                   "wait on real I/O, which this loop cannot simulate)")
            return ready
        self._vloop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh virtual-clock loop."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
