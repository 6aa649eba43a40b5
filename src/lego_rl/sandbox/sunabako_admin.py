"""Housekeeping on a local sunabako node: list its sandboxes and clean up leaked ones.

sunabako supervisors outlive the Python process that created them, so a crashed rollout leaves
sandboxes behind. The node records no owner, so "leaked" here means dead (failed after a timeout or
an OOM kill, or stopped, or a deletion left pending); ``include_running`` destroys every sandbox on the node, which is only
right when nothing else uses that state dir.
"""

from __future__ import annotations

import time
from typing import Any

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import cut_message
from lego_rl.sandbox.sunabako_provider import _default_binary, _sdk, destroy

DEFAULT_NODE_STATE = "/var/lib/sunabako"
DEAD_STATES = frozenset({"failed", "stopped", "cleanup_pending"})


def _node(state_dir: str | None) -> Any:
    return _sdk().Node(name="local", state_dir=state_dir or DEFAULT_NODE_STATE, binary=_default_binary())


def _records(node: Any) -> list[dict[str, Any]]:
    sdk = _sdk()
    try:
        records = node.call("list", timeout=30)
    except sdk.SandboxError as exc:
        raise SandboxError(f"sunabako node at {node.state_dir}: {cut_message(str(exc))}") from exc
    return records if isinstance(records, list) else []


def list_node(state_dir: str | None = None) -> list[dict[str, Any]]:
    """One row per sandbox: id, state, supervisor pid, rootfs, memory reason when it failed."""
    rows = []
    now = time.time()
    for rec in _records(_node(state_dir)):
        status = rec.get("status") or {}
        spec = rec.get("spec") or {}
        created = rec.get("created_at")
        rows.append({
            "id": spec.get("id", "?"),
            "state": status.get("state", "?"),
            "owner_pid": status.get("supervisor_pid"),
            "age_s": now - created if isinstance(created, (int, float)) else 0.0,
            "image": spec.get("rootfs", "?"),
            "reason": status.get("reason"),
        })
    return rows


async def gc_node(state_dir: str | None = None, *, include_running: bool = False) -> list[str]:
    """Stop and delete the node's non-running sandboxes (all with ``include_running``), then run gc."""
    node = _node(state_dir)
    sdk = _sdk()
    removed = []
    for row in list_node(state_dir):
        # Only states nothing will move on from; "creating" belongs to a create in flight elsewhere.
        if row["state"] not in DEAD_STATES and not include_running:
            continue
        await destroy(node, row["id"], sdk)
        removed.append(row["id"])
    try:
        await node.call_async("gc", timeout=120)  # retries deferred deletions
    except sdk.SandboxError as exc:
        raise SandboxError(f"sunabako gc at {node.state_dir}: {cut_message(str(exc))}") from exc
    return removed
