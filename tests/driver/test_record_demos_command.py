"""The demonstration's Bash command (scripts/record_demos.py ``patch_command``): run by real bash with the real
``patch`` on each example task's repository, it must leave exactly the reference fix; and it must stay short
enough for a policy trained on it to reproduce inside the response cap (the base64 form it replaced was
816 tokens of the tiny tokenizer for lego-example-median, beyond lego.toml's 256 and any small budget)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from record_demos import END, patch_command  # noqa: E402

ROWS = [json.loads(line) for line in (REPO / "examples/tasks/tasks.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("row", ROWS, ids=[r["metadata"]["instance_id"] for r in ROWS])
def test_the_command_applies_the_reference_patch(row: dict, tmp_path: Path) -> None:
    meta = row["metadata"]
    with tarfile.open(REPO / "examples/tasks" / meta["repo_archive"]) as tar:
        tar.extractall(tmp_path, filter="data")
    proc = subprocess.run(["bash", "-c", patch_command(meta["reference_patch"])], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diff = subprocess.run(["git", "-c", "core.fileMode=false", "diff"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout
    # the same hunks as the reference (index lines carry hashes git recomputes identically)
    assert diff == meta["reference_patch"]


def test_the_command_is_short_and_refuses_a_patch_holding_its_terminator() -> None:
    from transformers import AutoTokenizer

    from lego_rl.serving.tiny_model import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    median = next(r for r in ROWS if r["metadata"]["instance_id"] == "lego-example-median")
    patch = median["metadata"]["reference_patch"]
    # the verbatim diff plus ~30 tokens of framing (287 vs 255 here), not base64's ~3x
    assert len(tok(patch_command(patch))["input_ids"]) <= len(tok(patch)["input_ids"]) + 40
    with pytest.raises(SystemExit, match=END):
        patch_command(f"--- a/x\n+++ b/x\n{END}\n")


def test_every_demonstration_fits_the_main_jobs_cap() -> None:
    """The demonstrations are recorded, trained on and rolled out at lego.toml's model.max_response_tokens (Claude
    Code is told the same cap): each task's call must fit it, or the adapter cuts it, Claude Code exits 1
    ("exceeded the N output token maximum") and no policy trained on it can reproduce it. Below the longest
    call, the recorder refuses before any rollout, naming the task and both numbers."""
    import tomllib

    from transformers import AutoTokenizer

    from lego_rl.serving.tiny_model import ensure_tiny_model
    from record_demos import check_fits_cap, demo_call

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    cap = tomllib.loads((REPO / "lego.toml").read_text())["model"]["max_response_tokens"]
    check_fits_cap(ROWS, tok, cap)
    sizes = {r["metadata"]["instance_id"]: len(tok(demo_call(r))["input_ids"]) + 1 for r in ROWS}
    longest = max(sizes, key=sizes.__getitem__)
    with pytest.raises(SystemExit, match=f"{longest} is {sizes[longest]} tokens, over model.max_response_tokens = "
                                         f"{sizes[longest] - 1}"):
        check_fits_cap(ROWS, tok, sizes[longest] - 1)
