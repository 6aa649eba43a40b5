"""Config keys that nothing reads yet, and what will read them.

A key listed here is accepted (a launcher written for the reference example sets many of them), but
until the named feature lands it changes nothing, so ``lego validate`` refuses a non-default value
instead of letting an operator believe it took effect. Wiring a key means deleting its line here;
``tests/config/test_unwired.py`` keeps this list honest against the source tree (a listed key must have
no reader outside ``lego_rl.config``; an unlisted one must have one).
"""

from __future__ import annotations

VLLM = "lego starts the vLLM servers itself (today they are started outside lego)"

UNWIRED: dict[str, str] = {
    "serving.disable_cuda_graph": VLLM,
    "serving.cuda_graph_max_batch": VLLM,
    "sandbox.lifetime_s": "the sandbox providers take a hard lifetime (today a sandbox lives until closed)",
    "sandbox.rootfs": "the rollout passes a default root filesystem to bwrap (today an image without an "
                      "images.json entry is refused)",
    "grader.max_output_kb": "the grader cuts its saved output (today it keeps all of it)",
}
"""``section.key`` → what will read it (completes "it has no effect until ...")."""
