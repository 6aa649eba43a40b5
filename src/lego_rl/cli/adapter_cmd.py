"""`lego adapter`: the adapter on its own in front of a served model, for debugging a CLI by hand."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from lego_rl.cli.console import EXIT_INFRA, EXIT_USAGE, err, fail


def adapter(
    serving_url: str = typer.Option(..., "--serving-url", help="Base URL of the engine (vLLM or `lego serve`)."),
    model: Path = typer.Option(..., "--model", help="The served model's directory (tokenizer, chat template)."),
    open_sessions: Path = typer.Option(None, "--open-sessions", help=(
        "Open a session for any new key whose first request is valid; each session's turn records are "
        "appended (fsynced) under this directory as each turn ends (default for --session: "
        "./lego-adapter-records).")),
    session: list[str] = typer.Option([], "--session", help="Open this session id at start (repeatable)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(18091, help="Port to bind."),
    max_context_tokens: int = typer.Option(0, min=0, help="Prompt + output tokens per call (0: the model's window)."),
    max_response_tokens: int = typer.Option(8192, min=1, help="Most output tokens per call."),
    template_kwargs: str = typer.Option("{}", "--template-kwargs", help="JSON object of chat-template kwargs."),
    max_body_mb: float = typer.Option(32.0, "--max-body-mb", min=0.001, help=(
        "Largest accepted request body in MiB (larger ones are answered 413); adapter.max_body_mb in lego.toml.")),
    tool_call_parser: str = typer.Option(None, "--tool-call-parser", help=(
        "vLLM's name of the model's tool-call parser (serving.tool_call_parser); default: the built-in parser, "
        "qwen3_coder or hermes calls.")),
    reasoning_parser: str = typer.Option("qwen3", "--reasoning-parser", help=(
        "vLLM's name of the reasoning parser, or none (serving.reasoning_parser).")),
    workers: int = typer.Option(1, "--workers", min=1, help=(
        "Adapter processes behind the port (each session is held by one of them; use more than one when one "
        "process's CPU is the limit).")),
) -> None:
    """Serve Anthropic Messages, OpenAI Responses and Chat Completions over a served model.

    Point a CLI at it with the session id as its API key, e.g.
    `ANTHROPIC_BASE_URL=http://127.0.0.1:18091 ANTHROPIC_API_KEY=dev claude -p ...`.
    """
    import asyncio

    from lego_rl.adapter.multiproc import serve_workers
    from lego_rl.adapter.standalone import DEFAULT_RECORDS_DIR, StandaloneOptions, log_to_stderr, serve_standalone
    from lego_rl.errors import ConfigError

    try:
        kwargs = json.loads(template_kwargs)
    except ValueError as exc:
        kwargs = f"not valid JSON ({exc})"
    if not isinstance(kwargs, dict):
        why = kwargs if isinstance(kwargs, str) else "expected a JSON object"
        fail(f"--template-kwargs: {why}")
        raise typer.Exit(EXIT_USAGE)
    if not open_sessions and not session:
        fail("no way to open a session: pass --open-sessions DIR or --session ID")
        raise typer.Exit(EXIT_USAGE)
    opts = StandaloneOptions(serving_url=serving_url, model_dir=model, host=host, port=port,
                             open_sessions=open_sessions, sessions=session, max_context_tokens=max_context_tokens or None,
                             max_response_tokens=max_response_tokens, template_kwargs=kwargs,
                             max_body_bytes=int(max_body_mb * 1024 * 1024), tool_call_parser=tool_call_parser,
                             reasoning_parser=reasoning_parser)
    records = open_sessions or DEFAULT_RECORDS_DIR
    procs = f"; {workers} worker processes" if workers > 1 else ""
    err.print(f"lego adapter: http://{host}:{port} -> {serving_url} ({model}); turn records in {records}/{procs}",
              markup=False, highlight=False)
    log_to_stderr()
    try:
        if workers > 1:
            code = asyncio.run(serve_workers(opts, workers))
            if code:
                fail("an adapter worker process died; the others were stopped (records of answered turns are saved)")
                raise typer.Exit(EXIT_INFRA)
        else:
            asyncio.run(serve_standalone(opts))
    except ConfigError as exc:
        fail(exc)
        raise typer.Exit(EXIT_USAGE) from None
    except (OSError, RuntimeError) as exc:  # port in use, unreadable model files, a worker that did not start
        fail(exc)
        raise typer.Exit(EXIT_INFRA) from None
    except KeyboardInterrupt:
        pass


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `lego` app."""
    app.command("adapter")(adapter)
