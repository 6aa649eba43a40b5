"""A bounded pool of created, unused sandboxes, refilled in the background.

Why: a sunabako create is a copy of the image rootfs, a ``chown -R`` of it and a start-up handshake
that often fails under load (docs/sandboxes.md), seconds each. A rollout asks for its sandbox at a
known moment, but sandboxes can be made before that: while earlier rollouts run their agents. The pool
keeps up to ``size`` sandboxes ready per creation key (image and options), takes one in a few ms, and
starts a replacement at once. A pooled sandbox is as fresh as a new one: nothing ran in it but the
provider's own preparation, and it is checked alive (one ``true``) before it is handed out.

Bounds: at most ``size`` sandboxes ready or being made in total, whatever the number of keys; a key
that is not asked for again keeps what it has until ``aclose``. A refill that fails is logged and not
retried until the next request for that key, so a broken image never loops.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lego_rl.sandbox.base import ImageSpec, Sandbox

log = logging.getLogger(__name__)

Make = Callable[[ImageSpec, dict[str, Any]], Awaitable[Sandbox]]
PoolKey = tuple[str, str, str, str, str]


def pool_key(image: ImageSpec, options: Mapping[str, Any]) -> PoolKey:
    """Sandboxes made from equal keys are interchangeable."""
    return (
        image.name, image.rootfs or "", image.workdir, repr(sorted(image.env.items())),
        repr(sorted((k, repr(v)) for k, v in options.items())),
    )  # fmt: skip


class WarmPool:
    """Sandboxes made ahead by ``make`` (the provider's own create), handed out by ``take``."""

    def __init__(self, make: Make, size: int) -> None:
        if size < 1:
            raise ValueError(f"a warm pool needs size >= 1, got {size}")
        self._make = make
        self.size = size
        self._ready: defaultdict[PoolKey, deque[Sandbox]] = defaultdict(deque)
        self._filling: defaultdict[PoolKey, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.hits = 0
        """Requests answered from the pool."""
        self.misses = 0
        """Requests that created their sandbox on the spot (pool empty for that key)."""

    def _held(self) -> int:
        return sum(len(q) for q in self._ready.values()) + sum(self._filling.values())

    def ready(self, image: ImageSpec, options: Mapping[str, Any]) -> int:
        """How many sandboxes for this image and options are ready now."""
        return len(self._ready.get(pool_key(image, options), ()))

    async def take(self, image: ImageSpec, options: dict[str, Any]) -> Sandbox:
        """A ready sandbox for ``image``/``options`` if one is alive, else a new one; refill either way."""
        key = pool_key(image, options)
        queue = self._ready[key]
        while queue:
            sb = queue.popleft()
            if await _alive(sb):
                self.hits += 1
                self.fill(image, options)
                return sb
            log.warning("pooled sandbox %s died while waiting; closing it", sb.id)
            await _close_quietly(sb)
        self.misses += 1
        self.fill(image, options)
        return await self._make(image, dict(options))

    def fill(self, image: ImageSpec, options: Mapping[str, Any]) -> None:
        """Start background creates until this key has ``size`` ready or the total bound is reached."""
        key = pool_key(image, options)
        while (
            not self._closed
            and self._held() < self.size
            and len(self._ready[key]) + self._filling[key] < self.size
        ):
            self._filling[key] += 1
            task = asyncio.get_running_loop().create_task(self._fill_one(key, image, dict(options)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fill_one(self, key: PoolKey, image: ImageSpec, options: dict[str, Any]) -> None:
        try:
            sb = await self._make(image, options)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged, not retried: the next take for this key tries again
            log.warning("warm pool: creating a sandbox of %s failed: %s", image.name, exc)
            return
        finally:
            self._filling[key] -= 1
        if self._closed:
            await _close_quietly(sb)
            return
        self._ready[key].append(sb)

    async def wait_filled(self) -> None:
        """Wait for the creates in flight (benchmarks and tests measure a warm pool with it)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Close every ready sandbox, and each one in flight once its create ends.

        Creates in flight are awaited, not cancelled: a create cut off half-way may leave a sandbox
        the node still builds (sunabako), which nothing would then close.
        """
        self._closed = True
        await self.wait_filled()
        for queue in self._ready.values():
            while queue:
                await _close_quietly(queue.popleft())


async def _alive(sb: Sandbox) -> bool:
    try:
        return (await sb.exec(["true"], timeout=20)).ok
    except Exception:  # a lost sandbox raises on exec: not alive
        return False


async def _close_quietly(sb: Sandbox) -> None:
    try:
        await sb.close()
    except Exception as exc:  # the pool is being emptied; a close failure is logged, not raised
        log.warning("warm pool: closing sandbox %s failed: %s", sb.id, exc)
