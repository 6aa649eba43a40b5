"""Ray cluster mode end to end on this CPU machine: a real Ray head and a second Ray node (two raylets, two object
stores, told apart by the custom resources ``node_a`` / ``node_b``) in a loopback-only network namespace the test
creates, so Ray binds 127.0.0.1 and nothing outside can reach it (or be reached).

The run: ``lego train`` on the toy ``first_letter`` environment with ``cluster.mode = "ray"``: two torch trainer
ranks (FSDP2 over gloo) placed STRICT_SPREAD, one on each node, and two embedded-engine replicas as Ray actors,
one on each node too (so one of them is always on the other node than rank 0), their weights synced from rank 0
through the object store. It must train two steps with the results of the
same run in one process (no Ray): the same rewards, losses within fp32 reduction-order noise, the same final
weights within what Adam's first steps make of that noise. ``lego validate --remote`` on the same cluster: the
placement fits; asking for a GPU and a third trainer node names the missing resources, and ``lego train`` refuses
a third node before it starts any actor (exit 2). Then the Megatron backend on the same cluster: TP = 2 over the
two nodes' ranks, audited (`lego audit`) with the two replicas' served-token logs; and expert parallelism:
the tiny Qwen3-MoE with EP = 2, each node's rank holding half the experts, audited too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lego_rl.driver.toy_env import make_rows
from lego_rl.runstore.log import follow_metrics
from lego_rl.serving.tiny_model import ensure_tiny_model

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
LR = 1e-6  # train.lr's default, which both runs use

TOML = """
[serving]
device = "cpu"
port = 0

[sandbox]
provider = "bwrap"

[rollout]
prompt_data = "toy.jsonl"
batch_size = 2
samples_per_prompt = 4
top_p = 1.0
max_staleness = 0

[train]
environment = "first_letter"
num_rollout = 2

[paths]
run_root = "runs/toy"
"""

CLUSTER = """
[cluster]
mode = "ray"
trainer_nodes = 2
trainer_placement = "STRICT_SPREAD"
engine_replicas = 2
engine_placement = "STRICT_SPREAD"
"""


def _workdir(root: Path, toml: str) -> Path:
    root.mkdir()
    (root / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8, letters="a")))
    (root / "lego.toml").write_text(toml)
    return root


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEGO_", "SWE_", "ADAPTER_", "RAY_"))
           and k not in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}}
    return {**env, "OMP_NUM_THREADS": "1"}


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    step = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    files = sorted(step.rglob("model*.safetensors"))
    assert files, f"no model weights under {step}: {sorted(p.name for p in step.rglob('*'))}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


@pytest.mark.timeout(900)
def test_two_node_ray_run_equals_the_single_process_run(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("the test needs unshare(1) and ip(8) (util-linux, iproute2) to make its network namespace")
    pytest.importorskip("ray", reason="the `cluster` extra (make test-deps installs it)")
    single = _workdir(tmp_path / "single", TOML)
    ray_run = _workdir(tmp_path / "ray", TOML + CLUSTER)
    moe_model = ensure_tiny_model(moe=True)  # built here: the namespace's run only reads it
    ray_tmp = tempfile.mkdtemp(prefix="lego-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    t0 = time.monotonic()
    try:
        # The reference run in one process, meanwhile: the two share nothing (own ports, own run directories).
        base = subprocess.Popen([str(BIN / "lego"), "train", "-c", "lego.toml", "--json"], cwd=single,
                                env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ns = subprocess.run(["unshare", "-rnpf", "--mount-proc", sys.executable, str(HERE / "two_nodes.py"),
                             str(ray_run), ray_tmp, str(moe_model)], env=_clean_env(), capture_output=True, text=True,
                            timeout=900)
        base_out, base_err = base.communicate(timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    assert ns.returncode == 0, ns.stderr[-4000:]
    outcome = json.loads((ray_run / "outcome.json").read_text())
    assert base.returncode == 0, base_err[-4000:]

    # lego validate --remote against the live cluster.
    fits = outcome["validate_fits"]
    assert fits["rc"] == 0, fits["stdout"][-3000:] + fits["stderr"]
    assert not [f for f in json.loads(fits["stdout"])["findings"] if f["code"] in {"ray_resources", "unreachable"}]
    short = outcome["validate_short"]
    assert short["rc"] == 1, short["stdout"][-3000:] + short["stderr"]
    found = {f["message"] for f in json.loads(short["stdout"])["findings"] if f["code"] == "ray_resources"}
    assert any(m.startswith("Ray cluster 127.0.0.1:6390: GPU: the placement needs 3 (trainer 3), the cluster has 0 "
                            "over 2 node(s)") for m in found), found
    assert any("STRICT_SPREAD needs 3 nodes" in m for m in found), found

    short = outcome["train_short"]
    assert short["rc"] == 2, short["stdout"][-3000:] + short["stderr"]
    said = " ".join(short["stderr"].split())
    assert "the Ray cluster cannot hold the placement: CPU: trainer placement STRICT_SPREAD needs 3 nodes" in said

    # The two-node training run.
    train = outcome["train"]
    assert train["rc"] == 0, train["stdout"][-3000:] + train["stderr"]
    summary, base_summary = json.loads(train["stdout"]), json.loads(base_out)
    assert summary["status"] == base_summary["status"] == "completed"
    assert summary["steps_done"] == base_summary["steps_done"] == 2
    assert summary["weight_version"] == base_summary["weight_version"] == 2
    rows = {r.step: r.values for r in follow_metrics(ray_run / "runs/toy/metrics.jsonl").read()}
    base_rows = {r.step: r.values for r in follow_metrics(single / "runs/toy/metrics.jsonl").read()}
    assert sorted(rows) == sorted(base_rows) == [0, 1]
    for step in (0, 1):
        # Seeded per rollout: the same completions, hence the same rewards, exactly.
        assert rows[step]["reward_mean"] == base_rows[step]["reward_mean"], (step, rows[step], base_rows[step])
        # The same tokens trained...
        for k in ("tokens", "sampled_tokens", "admitted_rollouts", "zero_variance_groups", "weight_version"):
            assert rows[step][k] == base_rows[step][k], (step, k)
        # ...with the same figures, summed over micro-batches split across two ranks: equal up to fp32
        # reduction order (the loss itself is ~0 on GRPO's on-policy pass; the gradient norm is not).
        for k in ("loss", "pg_loss", "grad_norm", "entropy", "ratio_mean", "clip_frac_low", "clip_frac_high"):
            # loss and pg_loss are sums of O(1) terms that cancel to ~0 (advantages sum to zero per group, ratio 1):
            # what is left is fp32 rounding of the order, seen 2.7e-7 vs 5.0e-7 across the two layouts.
            noise = 2e-6 if k in ("loss", "pg_loss") else 1e-7
            assert rows[step][k] == pytest.approx(base_rows[step][k], rel=1e-4, abs=noise), (step, k)
    # Megatron ranks placed by Ray (TP = 2, one rank per node): the same first step's rollouts (same initial
    # weights, same seeded sampling), two steps trained, and the audit passes over both ranks' records.
    mega = outcome["train_megatron"]
    assert mega["rc"] == 0, mega["stdout"][-3000:] + mega["stderr"]
    assert json.loads(mega["stdout"])["steps_done"] == 2
    mega_rows = {r.step: r.values for r in follow_metrics(ray_run / "runs/megatron/metrics.jsonl").read()}
    assert mega_rows[0]["reward_mean"] == base_rows[0]["reward_mean"]
    assert mega_rows[0]["sampled_tokens"] == base_rows[0]["sampled_tokens"]
    audit = outcome["audit_megatron"]
    assert audit["rc"] == 0, audit["stdout"][-3000:] + audit["stderr"]
    report = json.loads(audit["stdout"])
    assert report["ranks"] == 2 and report["steps_trained"] >= 1, report
    assert sorted(p.name for p in (ray_run / "runs/megatron/audit").glob("engine-*.jsonl")) == [
        "engine-0.jsonl", "engine-1.jsonl"]
    # Expert parallelism placed by Ray: EP = 2 over the two nodes' ranks, each holding half the experts; both
    # steps ran, each rank saved its own optimizer shard, the gathered HF file has every expert, and the audit
    # passes over both ranks' records.
    ep = outcome["train_ep"]
    assert ep["rc"] == 0, ep["stdout"][-3000:] + ep["stderr"]
    assert json.loads(ep["stdout"])["steps_done"] == 2
    audit = outcome["audit_ep"]
    assert audit["rc"] == 0, audit["stdout"][-3000:] + audit["stderr"]
    report = json.loads(audit["stdout"])
    assert report["ranks"] == 2 and report["steps_trained"] >= 1, report
    ckpt = ray_run / "runs/ep/checkpoints/step-000001"
    marker = json.loads((ckpt / "lego_checkpoint.json").read_text())
    assert marker["backend"] == "megatron" and marker["expert_parallel"] == 2, marker
    assert {"trainer_state.ep0.tp0.pt", "trainer_state.ep1.tp0.pt"} <= {p.name for p in ckpt.iterdir()}
    before = _initial_weights(moe_model)
    after = {k: v.float() for k, v in load_file(str(ckpt / "model.safetensors")).items()}
    assert sorted(after) == sorted(before)  # every expert of both ranks, gathered into the HF layout
    moved = {int(n.split(".")[5]) for n in before if ".mlp.experts." in n and not torch.equal(before[n], after[n])}
    assert moved & {0, 1, 2, 3} and moved & {4, 5, 6, 7}, moved  # experts of both ranks (8 / EP 2) trained
    weights = _final_weights(ray_run / "runs/toy")
    base_weights = _final_weights(single / "runs/toy")
    # The sharded save writes the tied output head under its own name too (equal to the embedding).
    for extra in set(weights) - set(base_weights):
        assert extra == "lm_head.weight" and torch.equal(weights[extra], weights["model.embed_tokens.weight"])
    assert set(base_weights) <= set(weights)
    weights = {n: weights[n] for n in base_weights}
    initial = _initial_weights()
    diffs = {n: (weights[n].float() - base_weights[n].float()).abs() for n in weights}
    worst = max(float(d.max()) for d in diffs.values())
    off = sum(int((d > LR / 2).sum()) for d in diffs.values())
    total = sum(d.numel() for d in diffs.values())
    moved = max(float((base_weights[n].float() - initial[n]).abs().max()) for n in base_weights if n in initial)
    # Adam's first steps move a weight by ~lr·sign(g): where a gradient is ~0, the two reduction orders may give
    # it opposite signs, so such a weight differs by up to 2·lr per step. No more than that, and only for few.
    print(f"two-node Ray run + single-process run: {elapsed:.0f} s wall; ray start {outcome['ray_start_s']} s, "
          f"cluster train {train['seconds']} s; max weight difference {worst:.2e} (training moved {moved:.2e}), "
          f"{off}/{total} weights differ by more than lr/2")
    assert moved >= LR / 2, moved
    assert worst <= 4 * LR, (worst, moved)
    assert off <= total // 10_000, (off, total)


def _initial_weights(model: Path | None = None) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted((model or ensure_tiny_model()).glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out
