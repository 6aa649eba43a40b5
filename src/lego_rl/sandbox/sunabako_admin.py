"""Housekeeping on sunabako nodes: list their sandboxes and clean up leaked ones.

A node is the local one (a state dir on this host) or each node of a cluster.json, reached over SSH
like the provider reaches it. sunabako supervisors outlive the Python process that created them, so a
crashed rollout leaves sandboxes behind. The node records no owner, so "leaked" here means dead:
failed after a timeout or an OOM kill, stopped, a deletion left pending, or recorded as running while
its supervisor process is gone. The node's own records keep saying ``running`` after the node itself
died (a host crash, a power cut): sunabako 0.1.2 does not re-check them, so the supervisor's pid and
start time (``supervisor_pid``/``supervisor_start``, clock ticks since boot as in ``/proc/PID/stat``) are
checked on the node. ``include_running`` destroys every sandbox on the node, which is only right when
nothing else uses it.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from typing import Any

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import cut_message
from lego_rl.sandbox.sunabako_provider import _default_binary, _sdk, destroy, load_cluster_nodes, node_shell

DEFAULT_NODE_STATE = "/var/lib/sunabako"
DEAD_STATES = frozenset({"failed", "stopped", "cleanup_pending"})
LIVE_STATES = frozenset({"running", "creating", "paused"})

# One line per pid: "PID STATE START" (fields 3 and 22 of /proc/PID/stat, counted after the parenthesised
# comm, which may hold spaces), or "PID -" when no such process exists. A zombie (state Z) is a dead
# supervisor its parent has not reaped yet.
_STARTS = ('for p in "$@"; do s=$(sed "s/.*) //" /proc/$p/stat 2>/dev/null | cut -d" " -f1,20); '
           'echo "$p ${s:--}"; done')


def _local_node(state_dir: str | None) -> Any:
    return _sdk().Node(name="local", state_dir=state_dir or DEFAULT_NODE_STATE, binary=_default_binary())


def nodes_for(state_dir: str | None = None, cluster: str | None = None, *, ssh_config: str | None = None,
              ssh_port: int = 22) -> list[Any]:
    """The nodes to look after: those of ``cluster`` (a cluster.json), else the local one."""
    if cluster:
        return load_cluster_nodes(cluster, ssh_config=ssh_config, ssh_port=ssh_port)
    return [_local_node(state_dir)]


async def _records(node: Any) -> list[dict[str, Any]]:
    sdk = _sdk()
    try:
        records = await node.call_async("list", timeout=30)
    except sdk.SandboxError as exc:
        where = f"{node.name} ({node.host})" if node.host else f"at {node.state_dir}"
        raise SandboxError(f"sunabako node {where}: {cut_message(str(exc))}") from exc
    return records if isinstance(records, list) else []


async def _process_starts(node: Any, pids: list[int]) -> dict[int, int | None]:
    """Start time (clock ticks) of each pid on the node, None for a pid with no living process."""
    if not pids:
        return {}
    if node.host:
        text = await node_shell(node, "sh -c " + shlex.quote(_STARTS) + " sh " + " ".join(map(str, pids)))
    else:
        proc = await asyncio.create_subprocess_exec("sh", "-c", _STARTS, "sh", *map(str, pids),
                                                    stdout=asyncio.subprocess.PIPE)
        text = (await proc.communicate())[0].decode()
    starts: dict[int, int | None] = {}
    for line in text.splitlines():
        pid, state, start = (line.split() + ["", ""])[:3]
        if pid.isdigit():
            starts[int(pid)] = int(start) if start.isdigit() and state != "Z" else None
    return starts


async def list_nodes(nodes: list[Any]) -> list[dict[str, Any]]:
    """One row per sandbox of every node: node, id, state, supervisor pid, age, rootfs, failure reason.

    A record in a live state whose supervisor is gone is shown as ``dead`` (its stored state in
    ``recorded_state``)."""
    rows: list[dict[str, Any]] = []
    now = time.time()
    for node in nodes:
        records = await _records(node)
        sups = [int(r["status"]["supervisor_pid"]) for r in records
                if isinstance((r.get("status") or {}).get("supervisor_pid"), int)]
        starts = await _process_starts(node, sups)
        for rec in records:
            status = rec.get("status") or {}
            spec = rec.get("spec") or {}
            created = rec.get("created_at")
            state = status.get("state", "?")
            pid, start = status.get("supervisor_pid"), status.get("supervisor_start")
            row: dict[str, Any] = {
                "node": node.name,
                "id": spec.get("id", "?"),
                "state": state,
                "owner_pid": pid,
                "age_s": now - created if isinstance(created, (int, float)) else 0.0,
                "image": spec.get("rootfs", "?"),
                "reason": status.get("reason"),
            }
            # A reused pid is not the supervisor: the start time must match too.
            if state in LIVE_STATES and isinstance(pid, int) and starts.get(pid) != start:
                row["recorded_state"], row["state"] = state, "dead"
                row["reason"] = row["reason"] or f"supervisor {pid} is gone (the node restarted or it was killed)"
            rows.append(row)
    return rows


def list_node(state_dir: str | None = None) -> list[dict[str, Any]]:
    """The local node's rows (``list_nodes`` of it)."""
    return asyncio.run(list_nodes([_local_node(state_dir)]))


async def gc_nodes(nodes: list[Any], *, include_running: bool = False) -> list[str]:
    """Stop and delete the nodes' dead sandboxes (all with ``include_running``), then run each node's gc.

    Returns ``NODE/ID`` of every sandbox removed (just ``ID`` on the local node)."""
    sdk = _sdk()
    removed = []
    by_name = {node.name: node for node in nodes}
    for row in await list_nodes(nodes):
        # Only states nothing will move on from; "creating" with a living supervisor belongs to a create
        # in flight elsewhere.
        if row["state"] not in DEAD_STATES | {"dead"} and not include_running:
            continue
        node = by_name[row["node"]]
        await destroy(node, row["id"], sdk)
        removed.append(f"{node.name}/{row['id']}" if node.host else row["id"])
    for node in nodes:
        try:
            await node.call_async("gc", timeout=120)  # retries deferred deletions
        except sdk.SandboxError as exc:
            where = f"{node.name} ({node.host})" if node.host else f"at {node.state_dir}"
            raise SandboxError(f"sunabako gc on node {where}: {cut_message(str(exc))}") from exc
    return removed


async def gc_node(state_dir: str | None = None, *, include_running: bool = False) -> list[str]:
    """``gc_nodes`` of the local node."""
    return await gc_nodes([_local_node(state_dir)], include_running=include_running)

