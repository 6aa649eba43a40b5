"""What every command that starts engines checks first: the config's cross-parameter checks with the installed
harness plugins and the engine checks (``lego validate`` without ``--remote``). A command refuses to start when
one of them is an error; the CLI only renders the findings."""

from __future__ import annotations

from lego_rl.compose.engine_checks import ENGINE_CHECKS
from lego_rl.compose.harnesses import harness_inventory
from lego_rl.config.checks import run_checks
from lego_rl.config.findings import Finding
from lego_rl.config.resolve import ResolvedConfig


def preflight_errors(r: ResolvedConfig) -> list[Finding]:
    """The findings of severity ``error``: each stops a launch before anything starts."""
    findings = run_checks(r, harnesses=harness_inventory(r), extra=ENGINE_CHECKS)
    return [f for f in findings if f.severity == "error"]
