"""TEST DOUBLE of an installed vLLM that predates ``--enable-return-routed-experts`` (no older vLLM is
installed here): a package with the source layout ``serving.vllm_launch``'s probe reads and its own
dist-info, on the path of a wrapper around this interpreter."""

from __future__ import annotations

import sys
from pathlib import Path


def old_vllm(root: Path, version: str = "0.8.5") -> Path:
    """TEST DOUBLE of an installed vLLM whose argument parser predates ``--enable-return-routed-experts``:
    returns an interpreter (a wrapper around this one) that finds it first."""
    site = root / "site"
    (site / "vllm" / "engine").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "engine" / "arg_utils.py").write_text(
        'parser.add_argument("--enforce-eager")\nparser.add_argument("--logprobs-mode")\n')
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python
