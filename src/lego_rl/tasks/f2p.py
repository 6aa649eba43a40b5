"""f2p_script rows: ``remote_env_info`` with ``image_url``, ``workdir``, ``instance_id``, ``f2p_script``.

These rows come from other pipelines in their own shape; ``normalize_f2p_row`` lifts them into the
``TaskRow`` shape so the loader and grader treat them like any other row. ``pre_commands`` run in both
the agent and the grader sandbox, so the agent's diff applies to the same base.
"""

from __future__ import annotations

from typing import Any

from lego_rl.errors import TaskDataError

F2P_DATASET = "f2p_script"


def _prompt_text(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def normalize_f2p_row(raw: dict[str, Any]) -> dict[str, Any]:
    """Return ``raw`` in TaskRow shape when it is an f2p_script row; other rows pass through unchanged."""
    raw_meta = raw.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    env = raw.get("remote_env_info", meta.get("remote_env_info"))
    if env is None:
        return raw
    if not isinstance(env, dict):
        raise TaskDataError("remote_env_info must be an object")
    for key in ("image_url", "instance_id", "f2p_script"):
        if not isinstance(env.get(key), str) or not env[key]:
            raise TaskDataError(f"remote_env_info.{key} is missing or not a non-empty string")
    statement = meta.get("problem_statement") or env.get("problem_statement") or raw.get("problem_statement")
    statement = statement or _prompt_text(raw.get("prompt"))
    if not statement:
        raise TaskDataError("f2p_script row has no problem statement (metadata.problem_statement or a user prompt)")
    pre = env.get("pre_commands") or []
    if isinstance(pre, str):
        pre = [pre]
    if not isinstance(pre, list) or not all(isinstance(c, str) for c in pre):
        raise TaskDataError("remote_env_info.pre_commands must be a string or a list of strings")
    kept = {k: v for k, v in meta.items() if k != "remote_env_info"}
    new_meta = {
        **kept,
        "instance_id": env["instance_id"],
        "dataset": kept.get("dataset") or F2P_DATASET,
        "image": env["image_url"],
        "workdir": env.get("workdir") or kept.get("workdir") or "/testbed",
        "problem_statement": statement,
        "f2p_script": env["f2p_script"],
        "pre_commands": pre,
        "eval_user": kept.get("eval_user", "root"),
    }
    return {"prompt": [{"role": "user", "content": statement}], "label": env["instance_id"], "metadata": new_meta}
