"""Every cross-parameter check: a config that trips it, and the base config that does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lego_rl.config.checks import Finding, run_checks
from lego_rl.config.resolve import ResolvedConfig, resolve
from lego_rl.compose.harnesses import harness_inventory


def check(r: ResolvedConfig, environ: dict[str, str] | None = None) -> list[Finding]:
    """The checks as `lego validate` runs them, with the installed harness plugins."""
    return run_checks(r, harnesses=harness_inventory(r, environ=environ or {}))


def codes(path: Path | None, *overrides: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    r = resolve(path, environ=environ or {}, overrides=list(overrides))
    return {f.code: f.severity for f in check(r, environ)}


def test_base_config_is_clean(base_toml: Path) -> None:
    # The defaults train asynchronously (max_staleness 1) with TIS: nothing to say about them; without the
    # correction the lag is a warning (off_policy_correction's docstring says why).
    assert codes(base_toml) == {}
    assert codes(base_toml, "train.is_correction=\"none\"") == {"off_policy_uncorrected": "warning"}


@pytest.mark.parametrize(
    ("overrides", "severity"),
    [
        # the default (tis) corrects; these name "none" to see what the check says without a correction
        (["train.is_correction=\"none\"", "rollout.max_staleness=0"], None),
        (["train.is_correction=\"none\"", "rollout.max_staleness=0", "rollout.partial_rollouts=\"drop\""], None),
        (["train.is_correction=\"none\"", "rollout.max_staleness=2"], "warning"),
        (["train.is_correction=\"none\"", "rollout.max_staleness=2", "rollout.partial_rollouts=\"drop\""], "warning"),
        (["rollout.max_staleness=2", "train.is_correction=\"mis\""], None),
        # keep trains tokens past the bound, even at staleness 0: uncorrected, that is an error
        (["train.is_correction=\"none\"", "rollout.max_staleness=0", "rollout.partial_rollouts=\"keep\""], "error"),
        (["rollout.partial_rollouts=\"keep\"", "train.is_correction=\"tis\""], None),
    ],
)
def test_off_policy_tokens_without_a_correction(base_toml: Path, overrides: list[str], severity: str | None) -> None:
    r = resolve(base_toml, environ={}, overrides=overrides)
    found = [f for f in check(r) if f.code == "off_policy_uncorrected"]
    assert [f.severity for f in found] == ([severity] if severity else []), found
    for f in found:
        # the message quotes the values involved and the fix names the keys to change
        assert "train.is_correction=\"none\"" in f.message and "train.is_correction" in f.fix
        assert f"rollout.max_staleness={r.config.rollout.max_staleness}" in f.message
        assert "train.is_correction" in f.keys and "rollout.max_staleness" in f.keys


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        (["train.global_batch_size=3"], "global_batch"),
        (["train.tensor_parallel=2"], "parallelism"),
        (["train.backend=\"megatron\"", "train.tensor_parallel=2", "train.pipeline_parallel=8",
          "train.data_parallel=1", "cluster.gpus_per_node=8"], "parallelism"),
        (["train.tensor_parallel=2", "cluster.gpus_per_node=2"], "parallelism_backend"),
        (["model.max_response_tokens=70000"], "response_len"),
        (["harness.claude_code.autocompact_pct=101"], "harness_options"),
        (["harness.claude_code.autocompact_pct=0"], "harness_options"),
        (["harness.nosuch.version=\"1\""], "harness_unknown"),
        (["rollout.guard_s=1000"], "timeouts_guard"),
        (["sandbox.lifetime_s=1500"], "timeouts_lifetime"),
        (["rollout.temperature=-1"], "temperature"),
        (["rollout.top_p=0"], "top_p"),
        (["rollout.top_p=1.5"], "top_p"),
        (["rollout.top_k=0"], "top_k"),
        (["train.use_score_centering=true"], "score_centering"),
        (["train.algorithm=\"gspo\"", "train.loss_agg=\"token\""], "loss_agg_gspo"),
        (["train.algorithm=\"gspo\"", "train.use_score_centering=true", "rollout.capture_nucleus=true"],
         "score_centering_gspo"),
        (["rollout.capture_nucleus=true", "serving.backend=\"vllm\"", "serving.urls=[\"http://h:1\"]"],
         "nucleus_unavailable"),
        (["model.dtype=\"bfloat16\""], "logprob_convention"),
        (["serving.device=\"cuda\""], "logprob_convention"),
        (["rollout.use_rollout_routing_replay=true"], "r3_dense"),
        (["serving.tool_call_parser=\"qwen3coder\""], "tool_parser"),
        (["serving.reasoning_parser=\"think\""], "reasoning_parser"),
        (["serving.backend=\"vllm\""], "vllm_urls"),
        (["cluster.mode=\"ray\"", "serving.backend=\"vllm\"", "serving.urls=[\"http://h:1\"]"], "cluster_serving"),
        (["cluster.mode=\"ray\"", "cluster.train_head=\"10.0.0.1\"", "cluster.ray_address=\"10.0.0.7:6379\""],
         "cluster_ray_conflict"),
        (["cluster.mode=\"ray\"", "cluster.train_workers=[\"10.0.0.2\"]"], "cluster_train_head"),
        (["sandbox.provider=\"sunabako\""], "sunabako_memory"),
        (["model.checkpoint=\"/nonexistent/ckpt\""], "checkpoint"),
        (["model.checkpoint=\"lego:huge\""], "checkpoint"),
        (["harness.claude_code.cli_tarball=\"/nonexistent/cc.tgz\""], "missing_file"),
        (["rollout.prompt_data=\"/nonexistent/train.jsonl\""], "missing_file"),
        (["train.resume=true"], "resume_nothing"),
    ],
)
def test_check_fails(base_toml: Path, overrides: list[str], code: str) -> None:
    found = codes(base_toml, *overrides)
    assert found.get(code) == "error", found


@pytest.mark.parametrize("importable", [False, True])
def test_vllm_parser_names_need_vllm(base_toml: Path, monkeypatch: pytest.MonkeyPatch, importable: bool) -> None:
    """A name only vLLM has is refused where vLLM is not importable (the built-ins would have to read it), and
    accepted where it is; the refusal names the built-ins, an unknown name the known ones."""
    import lego_rl.chat.parser_names as parser_names  # the check imports it when it runs

    monkeypatch.setattr(parser_names, "vllm_importable", lambda: importable)
    r = resolve(base_toml, environ={}, overrides=["serving.tool_call_parser=\"kimi_k2\"",
                                                  "serving.reasoning_parser=\"deepseek_r1\""])
    found = {f.code: f for f in check(r)}
    for code in ("tool_parser_needs_vllm", "reasoning_parser_needs_vllm"):
        assert (code in found) is not importable, found.keys()
    if not importable:
        assert "qwen3_coder, hermes" in found["tool_parser_needs_vllm"].message
        assert "qwen3, none" in found["reasoning_parser_needs_vllm"].message
    unknown = {f.code: f for f in check(resolve(base_toml, environ={}, overrides=["serving.tool_call_parser=\"glm\""]))}
    assert "glm47" in unknown["tool_parser"].fix and "qwen3_coder" in unknown["tool_parser"].fix


def test_harness_must_be_installed(base_toml: Path, workdir: Path) -> None:
    assert codes(base_toml, "agent.default_harness=\"no_such_cli\"").get("harness_missing") == "error"
    row = json.loads((workdir / "tasks.jsonl").read_text())
    row["metadata"]["agent"] = "another_missing_cli"
    (workdir / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    r = resolve(base_toml, environ={})
    messages = [f.message for f in check(r) if f.code == "harness_missing"]
    assert any("another_missing_cli" in m and "metadata.agent" in m for m in messages)
    row["metadata"]["agent"] = "codex"
    (workdir / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    assert "harness_missing" not in codes(base_toml)


def test_global_batch_explicit_divisor_ok(base_toml: Path) -> None:
    assert "global_batch" not in codes(base_toml, "rollout.batch_size=4", "train.global_batch_size=2")


def test_megatron_layout_that_matches(base_toml: Path) -> None:
    found = codes(base_toml, "train.backend=\"megatron\"", "train.tensor_parallel=2", "train.pipeline_parallel=8",
                  "cluster.trainer_nodes=2", "cluster.gpus_per_node=8")
    assert "parallelism" not in found
    r = resolve(base_toml, environ={}, overrides=["train.backend=\"megatron\"", "train.tensor_parallel=2",
                                                   "train.pipeline_parallel=8", "cluster.trainer_nodes=2",
                                                   "cluster.gpus_per_node=8"])
    assert r.config.train.data_parallel == 1


def test_score_centering_with_nucleus_ok(base_toml: Path) -> None:
    assert "score_centering" not in codes(base_toml, "train.use_score_centering=true", "rollout.capture_nucleus=true")


def test_half_precision_truncation_agrees_with_a_captured_nucleus_or_without_truncation(base_toml: Path) -> None:
    assert "logprob_convention" not in codes(base_toml, "model.dtype=\"bfloat16\"", "rollout.capture_nucleus=true")
    assert "logprob_convention" not in codes(base_toml, "model.dtype=\"bfloat16\"", "rollout.top_p=1.0")
    assert "logprob_convention" not in codes(base_toml, "model.dtype=\"float32\"", "serving.device=\"cuda\"")


def test_r3_on_moe_checkpoint_ok(base_toml: Path, workdir: Path) -> None:
    ckpt = workdir / "moe"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 128}))
    found = codes(base_toml, f"model.checkpoint=\"{ckpt}\"", "rollout.use_rollout_routing_replay=true")
    assert "r3_dense" not in found and "checkpoint" not in found


def test_pipeline_stages_must_split_the_layers_evenly(base_toml: Path, workdir: Path) -> None:
    ckpt = workdir / "six-layers"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 6}))
    layout = [f"model.checkpoint=\"{ckpt}\"", "train.backend=\"megatron\"", "cluster.gpus_per_node=4"]
    r = resolve(base_toml, environ={}, overrides=[*layout, "train.pipeline_parallel=4"])
    (bad,) = [f for f in check(r) if f.code == "parallelism_pipeline"]
    assert f"pipeline_parallel = 4 does not divide the model's 6 layers (num_hidden_layers in {ckpt}" in bad.message
    assert bad.keys == ("train.pipeline_parallel",) and bad.severity == "error"
    for ok in (["train.pipeline_parallel=2", "train.tensor_parallel=2"], ["train.pipeline_parallel=1"]):
        found = codes(base_toml, *layout, *ok)
        assert "parallelism_pipeline" not in found and "parallelism" not in found, (ok, found)


def test_sunabako_memory_given_explicitly(base_toml: Path) -> None:
    found = codes(base_toml, environ={"SWE_SANDBOX_PROVIDER": "sunabako", "SUNABAKO_ALLOW_TEST_MEMORY": "0"})
    assert "sunabako_memory" not in found
    found = codes(base_toml, environ={"SWE_SANDBOX_PROVIDER": "sunabako", "SUNABAKO_ALLOW_TEST_MEMORY": "1"})
    assert found.get("sunabako_test_memory") == "warning"


SANDBOX_TRIPS = [
    (["sandbox.provider=\"sunabako\""], "sunabako_memory"),
    (["sandbox.provider=\"sunabako\"", "sandbox.allow_test_memory=true"], "sunabako_test_memory"),
    (["rollout.guard_s=1000"], "timeouts_guard"),
    (["sandbox.lifetime_s=10"], "timeouts_lifetime"),
    (["sandbox.provider=\"sunabako\"", "sandbox.allow_test_memory=false", "sandbox.disk_mb=1024"],
     "sandbox_disk_provider"),
    (["sandbox.cluster=\"nowhere.json\""], "missing_file"),
]


@pytest.mark.parametrize(("overrides", "code"), SANDBOX_TRIPS)
@pytest.mark.parametrize("run", ["environment", "sft"])
def test_sandbox_checks_apply_only_to_runs_that_open_sandboxes(base_toml: Path, overrides: list[str],
                                                                code: str, run: str) -> None:
    """An environment run or SFT opens no sandbox: a sandbox setting that fails coding-agent training
    (sunabako without its memory mode, a guard shorter than the agent's budget...) is no reason to refuse
    it."""
    assert code in codes(base_toml, *overrides)  # the coding-agent run on the same settings is refused
    skip = (["train.environment=\"first_letter\""] if run == "environment"
            else ["train.sft_data=\"tasks.jsonl\""])
    assert code not in codes(base_toml, *overrides, *skip), run


def test_greedy_is_a_warning(base_toml: Path) -> None:
    assert codes(base_toml, "rollout.temperature=0", "rollout.max_staleness=0") == {"temperature_greedy": "warning"}


def test_cluster_json(base_toml: Path, workdir: Path) -> None:
    bad = workdir / "cluster.json"
    bad.write_text("{nodes: ")
    assert codes(base_toml, f"sandbox.cluster=\"{bad}\"").get("bad_file") == "error"
    bad.write_text(json.dumps({"nodes": []}))
    assert codes(base_toml, f"sandbox.cluster=\"{bad}\"").get("cluster_json") == "error"
    bad.write_text(json.dumps({"nodes": [{"name": "s0"}]}))
    assert codes(base_toml, f"sandbox.cluster=\"{bad}\"").get("cluster_json") == "error"
    bad.write_text(json.dumps({"nodes": [{"name": "s0", "host": "10.0.0.1", "port": 22}]}))
    assert "cluster_json" not in codes(base_toml, f"sandbox.cluster=\"{bad}\"")


def test_images_json_missing_entry_and_unparsable(base_toml: Path, workdir: Path) -> None:
    (workdir / "images.json").write_text(json.dumps({"other:1": {"rootfs": "/"}}))
    assert codes(base_toml).get("images_missing") == "error"
    (workdir / "images.json").write_text("not json")
    assert codes(base_toml).get("bad_file") == "error"


def test_rootfs_of_used_image_must_exist(base_toml: Path, workdir: Path) -> None:
    (workdir / "images.json").write_text(json.dumps({"img:1": {"rootfs": str(workdir / "gone")}}))
    assert codes(base_toml).get("rootfs_missing") == "error"
    (workdir / "gone").mkdir()
    assert "rootfs_missing" not in codes(base_toml)


def test_dataset_rows_reported_with_row_numbers(base_toml: Path, workdir: Path) -> None:
    good = (workdir / "tasks.jsonl").read_text()
    (workdir / "tasks.jsonl").write_text(good + "{broken\n" + json.dumps({"prompt": "x", "metadata": {}}) + "\n")
    r = resolve(base_toml, environ={})
    messages = [f.message for f in check(r) if f.code == "dataset_row"]
    assert any("row 2: invalid JSON" in m for m in messages)
    assert any("row 3: " in m and "metadata.image: Field required" in m for m in messages)


def test_run_root_holding_a_run(base_toml: Path, workdir: Path) -> None:
    run = workdir / "run-001"
    run.mkdir()
    (run / "events.jsonl").write_text("")
    assert codes(base_toml, f"paths.run_root=\"{run}\"").get("run_root_exists") == "error"
    assert "run_root_exists" not in codes(base_toml, f"paths.run_root=\"{run}\"", "train.resume=true")


def test_errors_sorted_before_warnings(base_toml: Path) -> None:
    r = resolve(base_toml, environ={}, overrides=["rollout.temperature=0", "rollout.top_k=0"])
    severities = [f.severity for f in check(r)]
    assert severities == sorted(severities, key=lambda s: s != "error")
    assert severities[0] == "error"


def test_row_without_eval_cmd_is_reported_like_rollout_check_rejects_it(base_toml: Path, workdir: Path) -> None:
    from lego_rl.errors import TaskDataError
    from lego_rl.compose.sessions.check_session import RolloutCheckSession

    row = json.loads((workdir / "tasks.jsonl").read_text())
    del row["metadata"]["eval_cmd"]
    (workdir / "tasks.jsonl").write_text((workdir / "tasks.jsonl").read_text() + json.dumps(row) + "\n")
    r = resolve(base_toml, environ={})
    [f] = [f for f in check(r) if f.code == "dataset_row"]
    assert f.severity == "error" and "row 2: " in f.message and "metadata needs eval_cmd" in f.message
    with pytest.raises(TaskDataError, match="row 2: .*metadata needs eval_cmd"):
        RolloutCheckSession(r)


def test_custom_row_keys_read_alike_by_validate_and_rollout_check(base_toml: Path, workdir: Path) -> None:
    from lego_rl.compose.sessions.check_session import RolloutCheckSession

    row = {"messages": [{"role": "user", "content": "fix it"}], "id": "t1",
           "info": {"instance_id": "t1", "docker_image": "img:1", "eval_cmd": "true", "problem_statement": "p"}}
    (workdir / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    assert codes(base_toml).get("dataset_row") == "error"  # read with the default keys: no `prompt`
    keys = ["rollout.input_key=messages", "rollout.label_key=id", "rollout.metadata_key=info",
            "agent.sandbox_image_metadata_key=docker_image"]
    assert codes(base_toml, *keys, "rollout.max_staleness=0") == {}
    r = resolve(base_toml, environ={}, overrides=keys)
    session = RolloutCheckSession(r)
    [loaded] = session.rows
    assert (loaded.label, loaded.metadata.image) == ("t1", "img:1")
    session.run_dir.close()
    # The image named under the custom key is the one validate checks against images.json.
    (workdir / "images.json").write_text(json.dumps({"other:1": {"rootfs": "/"}}))
    assert codes(base_toml, *keys).get("images_missing") == "error"


def test_many_bad_rows_are_counted(base_toml: Path, workdir: Path) -> None:
    (workdir / "tasks.jsonl").write_text("{bad\n" * 8)
    r = resolve(base_toml, environ={})
    found = [f for f in check(r) if f.code.startswith("dataset_row")]
    assert [f.code for f in found] == ["dataset_row"] * 5 + ["dataset_rows"]
    assert "3 more bad rows (8 in all, 0 good)" in found[-1].message


def test_unmapped_images_without_images_json_are_an_error(workdir: Path) -> None:
    """Without images.json a rollout can open only "host" or an absolute rootfs: any other image name in the
    dataset fails every rollout at sandbox_setup, so validate refuses it up front (it used to warn that the
    host root would be used, which is not what happens)."""
    (workdir / "images.json").unlink()
    path = workdir / "lego.toml"
    path.write_text('[sandbox]\nprovider = "bwrap"\n\n[rollout]\nprompt_data = "tasks.jsonl"\n')
    findings = check(resolve(path, environ={}))
    [finding] = [f for f in findings if f.code == "images_unmapped"]
    assert finding.severity == "error" and "img:1" in finding.message
    # The same dataset naming the host root (or an absolute rootfs directory) needs no mapping.
    row = json.loads((workdir / "tasks.jsonl").read_text())
    for image in ("host", str(workdir)):
        row["metadata"]["image"] = image
        (workdir / "tasks.jsonl").write_text(json.dumps(row) + "\n")
        assert "images_unmapped" not in {f.code for f in check(resolve(path, environ={}))}, image


def test_start_ray_on_a_head_and_an_address_to_join_is_a_conflict_naming_both(base_toml: Path) -> None:
    r = resolve(base_toml, environ={}, overrides=[
        "cluster.mode=\"ray\"", "cluster.train_head=\"10.0.0.1\"", "cluster.ray_address=\"10.0.0.7:6379\""])
    [f] = [f for f in run_checks(r, harnesses=harness_inventory(r, environ={})) if f.code == "cluster_ray_conflict"]
    assert f.message == ("cluster.start_ray = true with cluster.train_head = '10.0.0.1' starts a new Ray cluster "
                         "there, but cluster.ray_address = '10.0.0.7:6379' names one to join")
    assert f.keys == ("cluster.ray_address", "cluster.start_ray", "cluster.train_head")
    # Either way out is clean: join the running cluster (start_ray = false), or start Ray without an address.
    for fix in (["cluster.start_ray=false"], ["cluster.ray_address=\"\""]):
        r = resolve(base_toml, environ={}, overrides=[
            "cluster.mode=\"ray\"", "cluster.train_head=\"10.0.0.1\"", "cluster.train_workers=[\"10.0.0.2\"]",
            "cluster.ray_address=\"10.0.0.7:6379\"", *fix])
        assert not [f for f in run_checks(r, harnesses=harness_inventory(r, environ={})) if f.code.startswith("cluster_")], fix


def test_expert_parallel_checks(base_toml: Path) -> None:
    """train.expert_parallel: the Megatron backend, a MoE model whose experts and DP size it divides; TP = 1 for any
    Megatron MoE run;
    each finding names the values (the tiny MoE's config.json: 8 experts)."""
    from lego_rl.serving.tiny_model import ensure_tiny_model

    moe = f"model.checkpoint=\"{ensure_tiny_model(moe=True)}\""
    good = ["train.backend=\"megatron\"", moe, "train.expert_parallel=2", "cluster.gpus_per_node=4"]
    found = codes(base_toml, *good)
    assert not {c for c in found if c.startswith("expert_parallel")}, found
    r = resolve(base_toml, environ={}, overrides=[*good, "train.expert_parallel=3"])
    by_code = {f.code: f for f in check(r)}
    assert "3 does not divide the model's 8 experts" in by_code["expert_parallel_experts"].message
    assert "3 does not divide the data-parallel size 4" in by_code["expert_parallel_dp"].message
    assert codes(base_toml, *good, "train.backend=\"torch\"").get("expert_parallel_backend") == "error"
    assert codes(base_toml, *good, "model.checkpoint=\"lego:tiny\"").get("expert_parallel_dense") == "error"
    assert codes(base_toml, *good, "train.tensor_parallel=2").get("parallelism_moe_tp") == "error"
    assert codes(base_toml, *good, "train.tensor_parallel=2", "train.expert_parallel=1").get(
        "parallelism_moe_tp") == "error"
    assert not {c for c in codes(base_toml, *good, "train.pipeline_parallel=2") if c.startswith("expert_parallel")}
    assert codes(base_toml, *good, "train.data_parallel=1", "cluster.gpus_per_node=1").get(
        "expert_parallel_dp") == "error"


def test_sequence_parallel_checks(base_toml: Path) -> None:
    """train.sequence_parallel: what lets a MoE model train under TP (parallelism_moe_tp goes away); it needs
    the Megatron backend, does nothing at TP = 1 (a warning), and is refused with pipeline stages or with expert
    parallelism (neither combination is built)."""
    from lego_rl.serving.tiny_model import ensure_tiny_model

    moe = f"model.checkpoint=\"{ensure_tiny_model(moe=True)}\""
    tp2 = ["train.backend=\"megatron\"", moe, "train.tensor_parallel=2", "cluster.gpus_per_node=2"]
    assert codes(base_toml, *tp2).get("parallelism_moe_tp") == "error"
    found = codes(base_toml, *tp2, "train.sequence_parallel=true")
    assert not {c for c in found if c.startswith(("parallelism", "sequence_parallel"))}, found
    r = resolve(base_toml, environ={}, overrides=[*tp2, "train.sequence_parallel=false"])
    moe_tp = {f.code: f for f in check(r)}["parallelism_moe_tp"]
    assert "train.sequence_parallel = true" in moe_tp.fix, moe_tp
    assert codes(base_toml, *tp2, "train.sequence_parallel=true", "train.backend=\"torch\"").get(
        "sequence_parallel_backend") == "error"
    assert codes(base_toml, "train.backend=\"megatron\"", "train.sequence_parallel=true").get(
        "sequence_parallel_tp1") == "warning"
    assert codes(base_toml, *tp2, "train.sequence_parallel=true", "train.pipeline_parallel=2",
                 "cluster.gpus_per_node=4").get("sequence_parallel_pp") == "error"
    assert codes(base_toml, *tp2, "train.sequence_parallel=true", "train.expert_parallel=2",
                 "cluster.gpus_per_node=4").get("sequence_parallel_ep") == "error"


def test_disk_cap_is_a_bwrap_option(base_toml: Path) -> None:
    """sandbox.disk_mb is enforced by bwrap's loop-mounted layer; asked of sunabako (agent or grader) it is
    refused by name rather than silently not enforced."""
    assert not {c for c in codes(base_toml, "sandbox.provider=\"bwrap\"", "sandbox.disk_mb=4096")
                if c.startswith("sandbox_disk")}
    r = resolve(base_toml, environ={}, overrides=["sandbox.provider=\"bwrap\"", "sandbox.disk_mb=4096",
                                                  "grader.provider=\"sunabako\"", "sandbox.allow_test_memory=true"])
    found = {f.code: f for f in check(r)}["sandbox_disk_provider"]
    assert found.severity == "error" and "sunabako has no per-sandbox disk cap" in found.message, found
    with pytest.raises(Exception, match="disk_mb"):
        resolve(base_toml, environ={}, overrides=["sandbox.disk_mb=10"])  # below the 64 MiB floor


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ([], False),  # checkpointing is on by default
        (["train.gradient_checkpointing=false"], True),  # with lego.toml's / the default 65,536-token context
        (["train.gradient_checkpointing=false", "model.max_context_tokens=32768"], True),
        (["train.gradient_checkpointing=false", "model.max_context_tokens=32767"], False),
        (["train.gradient_checkpointing=false", "model.max_context_tokens=8192", "model.max_response_tokens=1024"],
         False),
    ],
)
def test_long_segments_without_checkpointing_are_a_warning(base_toml: Path, overrides: list[str], warned: bool) -> None:
    r = resolve(base_toml, environ={}, overrides=overrides)
    found = [f for f in check(r) if f.code == "activations_long_segment"]
    assert [f.severity for f in found] == (["warning"] if warned else []), found
    for f in found:
        assert f"model.max_context_tokens = {r.config.model.max_context_tokens}" in f.message
        assert "train.gradient_checkpointing = true" in f.fix
        assert set(f.keys) == {"train.gradient_checkpointing", "model.max_context_tokens"}


def test_gradient_checkpointing_is_on_unless_turned_off(base_toml: Path) -> None:
    from lego_rl.compose.train_session import megatron_settings, torch_settings

    unset = resolve(base_toml, environ={}).config
    assert unset.train.gradient_checkpointing is None
    assert torch_settings(unset).gradient_checkpointing is True
    assert megatron_settings(unset).gradient_checkpointing is None  # the backend decides by its device
    off = resolve(base_toml, environ={}, overrides=["train.gradient_checkpointing=false"]).config
    assert torch_settings(off).gradient_checkpointing is False and megatron_settings(off).gradient_checkpointing is False
