"""`lego sandbox`: list providers, run a command in a throw-away sandbox, find and clean leaks.

Exit codes (console.py): 0 ok; 1 the command inside the sandbox failed (``exec``); 2 bad usage;
3 the sandbox could not be created, used or destroyed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from lego_rl.cli.console import EXIT_FAILED, EXIT_INFRA, EXIT_USAGE, err, escape, fail, out

sandbox_app = typer.Typer(help="Sandboxes: providers, a debugging shell command, leak listing and cleanup.",
                          no_args_is_help=True)

ProviderOpt = Annotated[str, typer.Option("--provider", "-p", help="bwrap | sunabako (| e2b for exec).")]
StateOpt = Annotated[str | None, typer.Option("--state-dir", help="Provider state dir (bwrap: "
                                               "/var/lib/lego-rl/bwrap; sunabako: the node's state dir).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="sunabako: a "
                                                "cluster.json; its nodes are reached over SSH instead of the "
                                                "local node.")]
SshConfigOpt = Annotated[str | None, typer.Option("--ssh-config", help="sunabako with --cluster: the SSH client "
                                                  "config file for the nodes (default: the user's).")]


def _fail(message: str, code: int) -> typer.Exit:
    fail(message)
    return typer.Exit(code)


@sandbox_app.command("providers")
def providers(as_json: JsonOut = False) -> None:
    """List the registered sandbox providers (built-ins and entry points)."""
    from lego_rl.sandbox.factory import available_providers

    known = available_providers()
    if as_json:
        out.print_json(json.dumps(known))
        return
    table = Table("name", "implementation", title="sandbox providers", title_justify="left")
    for name, target in known.items():
        table.add_row(escape(name), escape(target))
    out.print(table)


@sandbox_app.command("exec")
def exec_(
    image: Annotated[str, typer.Argument(help="'host', an absolute rootfs directory, or a name in --images.")],
    command: Annotated[list[str], typer.Argument(help="Command after --, e.g. -- git status.")],
    provider: ProviderOpt = "bwrap",
    images: Annotated[str | None, typer.Option("--images", help="images.json (lego images) to look IMAGE up in; "
                                               "its workdir and env apply.")] = None,
    workdir: Annotated[str | None, typer.Option("--workdir", "-w", help="Working directory inside "
                                                "(default: the image's, else /).")] = None,
    user: Annotated[str, typer.Option("--user", "-u", help="root or agent (or another user in the image).")] = "root",
    network: Annotated[str, typer.Option("--network", help="none (loopback only), host, or allowlist (only the "
                                         "--allow endpoints).")] = "none",
    allow: Annotated[list[str] | None, typer.Option("--allow", help="ADDRESS:PORT reachable under --network "
                                                    "allowlist (repeatable).")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="Memory limit in MiB.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds before the command is killed.")] = None,
    state_dir: StateOpt = None,
) -> None:
    """Create a sandbox, run one command in it, print its output, destroy the sandbox."""
    import os

    from lego_rl.errors import SandboxError
    from lego_rl.sandbox import ImageSpec, available_providers, create_sandbox

    if provider not in available_providers():
        raise _fail(f"unknown sandbox provider {provider!r}; known: {', '.join(available_providers())}", EXIT_USAGE)
    if images is not None:
        from dataclasses import replace

        from lego_rl.images.importer import load_images_json

        mapping = load_images_json(images)  # a TaskDataError is shown by main() with exit code 2
        if image not in mapping:
            raise _fail(f"image {image!r} is not in {images} ({len(mapping)} images)", EXIT_USAGE)
        spec = replace(mapping[image], workdir=workdir or mapping[image].workdir)
    elif image != "host" and not (os.path.isabs(image) and os.path.isdir(image)):
        raise _fail(f"image {image!r} is neither 'host' nor an absolute rootfs directory", EXIT_USAGE)
    else:
        spec = ImageSpec(name=image, rootfs=None if image == "host" else image, workdir=workdir or "/")
    options: dict[str, Any] = {"network": network}
    if allow:
        options["allow"] = list(allow)
    if memory_mb is not None:
        options["memory_mb"] = memory_mb
    argv = command[0] if len(command) == 1 else command

    async def run() -> Any:
        async with create_sandbox(spec, provider=provider, provider_options=_state(provider, state_dir),
                                  **options) as sb:
            return await sb.exec(argv, user=user, timeout=timeout)

    try:
        res = asyncio.run(run())
    except SandboxError as exc:
        raise _fail(str(exc), EXIT_INFRA) from None
    out.out(res.stdout, end="", highlight=False)
    err.out(res.stderr, end="", highlight=False)
    if res.timed_out:
        raise _fail(f"timed out after {timeout} s", EXIT_FAILED)
    if res.exit_code != 0:
        raise typer.Exit(EXIT_FAILED)


def _state(provider: str, state_dir: str | None) -> dict[str, Any]:
    return {"state_dir": state_dir} if state_dir and provider in ("bwrap", "sunabako") else {}


@sandbox_app.command("ls")
def ls(provider: ProviderOpt = "bwrap", state_dir: StateOpt = None, cluster: ClusterOpt = None,
       ssh_config: SshConfigOpt = None, as_json: JsonOut = False) -> None:
    """List the sandboxes a provider holds on this machine (sunabako: or on the nodes of --cluster);
    'leaked' (bwrap) and 'dead' (sunabako) ones have no living owner."""
    rows = _listing(provider, state_dir, cluster, ssh_config)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    columns = ("node",) if cluster and provider == "sunabako" else ()
    table = Table(*columns, "id", "state", "owner pid", "age s", "image", title=escape(f"{provider} sandboxes"),
                  title_justify="left")
    for r in rows:
        # Ids and image names come from the provider's state on disk: shown literally, never read as markup.
        cells = (*(r["node"] for _ in columns), r["id"], r["state"], str(r.get("owner_pid") or "-"),
                 f"{r.get('age_s', 0):.0f}", r["image"])
        table.add_row(*(escape(str(cell)) for cell in cells))
    out.print(table)


def _sunabako_nodes(state_dir: str | None, cluster: str | None, ssh_config: str | None) -> list[Any]:
    from lego_rl.errors import SandboxError
    from lego_rl.sandbox.sunabako_admin import nodes_for

    if cluster and state_dir:
        raise _fail("--state-dir names the local sunabako node and --cluster the remote ones: give one", EXIT_USAGE)
    if ssh_config and not cluster:
        raise _fail("--ssh-config applies to the nodes of --cluster only", EXIT_USAGE)
    try:
        return nodes_for(state_dir, cluster, ssh_config=ssh_config)
    except SandboxError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


def _listing(provider: str, state_dir: str | None, cluster: str | None = None,
             ssh_config: str | None = None) -> list[dict[str, Any]]:
    from lego_rl.errors import SandboxError

    if provider == "bwrap":
        from lego_rl.sandbox.bwrap_state import DEFAULT_STATE_ROOT, list_state

        return [{"id": e.id, "state": "running" if e.alive else "leaked", "owner_pid": e.owner_pid,
                 "age_s": e.age_s, "image": e.image} for e in list_state(state_dir or DEFAULT_STATE_ROOT)]
    if provider == "sunabako":
        from lego_rl.sandbox.sunabako_admin import list_nodes

        nodes = _sunabako_nodes(state_dir, cluster, ssh_config)
        try:
            return asyncio.run(list_nodes(nodes))
        except SandboxError as exc:
            raise _fail(str(exc), EXIT_INFRA) from None
    raise _fail(f"`lego sandbox ls` knows bwrap and sunabako, not {provider!r}", EXIT_USAGE)


@sandbox_app.command("gc")
def gc(
    provider: ProviderOpt = "bwrap",
    state_dir: StateOpt = None,
    cluster: ClusterOpt = None,
    ssh_config: SshConfigOpt = None,
    all_: Annotated[bool, typer.Option("--all", help="Also destroy sandboxes that still have an owner.")] = False,
) -> None:
    """Destroy leaked sandboxes (bwrap: owner process gone; sunabako: failed, stopped, pending deletion, or
    recorded running with its supervisor gone, as after a node crash; on every node of --cluster)."""
    from lego_rl.errors import SandboxError

    nodes = _sunabako_nodes(state_dir, cluster, ssh_config) if provider == "sunabako" else []
    try:
        if provider == "bwrap":
            from lego_rl.sandbox.bwrap_state import DEFAULT_STATE_ROOT, gc_state

            removed = gc_state(state_dir or DEFAULT_STATE_ROOT, include_alive=all_)
        elif provider == "sunabako":
            from lego_rl.sandbox.sunabako_admin import gc_nodes

            removed = asyncio.run(gc_nodes(nodes, include_running=all_))
        else:
            raise _fail(f"`lego sandbox gc` knows bwrap and sunabako, not {provider!r}", EXIT_USAGE)
    except SandboxError as exc:
        raise _fail(str(exc), EXIT_INFRA) from None
    out.print(f"removed {len(removed)} sandbox(es)" + (": " + ", ".join(removed) if removed else ""), markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
