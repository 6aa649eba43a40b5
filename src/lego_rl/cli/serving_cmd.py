"""`lego serve` (the embedded engine) and `lego model tiny` (build the offline test model)."""

from __future__ import annotations

from pathlib import Path

import typer

from lego_rl.cli.console import EXIT_USAGE, err, fail, out

model_app = typer.Typer(help="Build and inspect local models.", no_args_is_help=True)


@model_app.command("tiny")
def model_tiny(
    out_dir: Path = typer.Option(..., "--out", help="Directory to write the model into (created)."),
    seed: int = typer.Option(0, help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Replace an existing directory."),
    moe: bool = typer.Option(False, "--moe", help="Build the Qwen3-MoE variant (8 experts, top-2) for R3 tests."),
) -> None:
    """Build the tiny Qwen3-architecture model (random weights, our BPE and chat template) offline."""
    from lego_rl.errors import ConfigError
    from lego_rl.serving.tiny_model import build_tiny_model

    try:
        path = build_tiny_model(out_dir, seed=seed, force=force, moe=moe)
    except ConfigError as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    out.print(str(path), markup=False, highlight=False)


def serve(
    model: Path = typer.Option(
        ..., "--model", help="Local HF causal-LM directory (config, weights, tokenizer), or lego:tiny."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="Port to bind (0: a free one)."),
    device: str = typer.Option("cpu", help="cpu, or cuda / cuda:N for one GPU."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    max_batch: int = typer.Option(16, min=1, help="Most requests decoded together."),
    max_model_len: int = typer.Option(0, min=0, help="Context limit (0: the model's max positions)."),
    threads: int = typer.Option(0, min=0, help="torch CPU threads (0: torch's default)."),
    return_routed_experts: bool = typer.Option(
        False, "--return-routed-experts", help="MoE models: return each token's experts (as vLLM's flag)."),
    precision: str = typer.Option(
        "weights", help="weights: compute in --dtype. trainer: fp32 weights with bf16 matmuls and attention, as the "
        "trainers' autocast computes on CUDA (serving.precision; overrides --dtype)."),
    served_log: Path | None = typer.Option(
        None, "--served-log", help="Append every finished generation (token ids, logprobs, weight versions) to this "
        "JSON-lines file, the engine's record for `lego audit` (a run's audit/engine-<name>.jsonl)."),
) -> None:
    """Serve a model with lego's embedded engine on vLLM's token-in/token-out routes."""
    import asyncio

    from lego_rl.cli.console import EXIT_INFRA
    from lego_rl.errors import ConfigError

    if str(model) == "lego:tiny":
        from lego_rl.serving.tiny_model import ensure_tiny_model

        model = ensure_tiny_model()
    if precision not in ("weights", "trainer"):
        err.print(f"--precision must be weights or trainer, got {precision!r}", markup=False)
        raise typer.Exit(EXIT_USAGE)
    compute: str | None = None
    if precision == "trainer":
        from lego_rl.serving.engine import engine_precision

        dtype, compute = engine_precision(device, "auto", "trainer")  # bf16 compute on CUDA, fp32 on CPU
    try:
        asyncio.run(_serve(model, host, port, served_log=served_log, device=device, dtype=dtype,
                           compute_dtype=compute, max_batch=max_batch, max_model_len=max_model_len or None,
                           threads=threads or None, return_routed_experts=return_routed_experts))
    except ConfigError as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    except OSError as exc:  # port in use, unreadable files
        fail(exc)
        raise typer.Exit(EXIT_INFRA) from None
    except KeyboardInterrupt:
        pass


async def _serve(model: Path, host: str, port: int, *, served_log: Path | None, **engine_kw: object) -> None:
    import asyncio
    import signal

    from lego_rl.serving.server import EmbeddedServer

    server = EmbeddedServer(model, host=host, port=port, served_log=served_log, **engine_kw)
    await server.start()
    err.print(f"lego serve: {model} on {server.url} (POST /inference/v1/generate)", markup=False, highlight=False)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `lego` app."""
    app.add_typer(model_app, name="model")
    app.command("serve")(serve)
