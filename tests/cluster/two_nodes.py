"""Run inside a fresh loopback-only network + PID namespace (``unshare -rnpf --mount-proc``, see
test_two_nodes.py): start a real two-node Ray cluster, check it with ``lego validate --remote``, train with it.

Usage: ``python two_nodes.py WORKDIR RAY_TMP MOE_MODEL`` (MOE_MODEL: the tiny Qwen3-MoE's directory). WORKDIR holds ``lego.toml`` and ``toy.jsonl``; the outcome of each
command goes to ``WORKDIR/outcome.json``. The PID namespace is what cleans up: when this script (its PID 1)
exits, the kernel ends every Ray process it started, and nothing outside the namespace is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PORT = 6390


def main(work: Path, ray_tmp: str, moe_model: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    bindir = Path(sys.executable).parent
    # RAY_TMPDIR: the drivers' session files too go under the test's directory, not the machine's /tmp/ray.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp}
    outcome: dict[str, object] = {}
    t0 = time.monotonic()
    # Node A (the head) and node B: two raylets with their own object stores, told apart by a custom resource.
    for args in (["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={ray_tmp}",
                  "--resources", '{"node_a": 1}'],
                 [f"--address=127.0.0.1:{PORT}", "--resources", '{"node_b": 1}']):
        subprocess.run([str(bindir / "ray"), "start", "--num-cpus=3", "--disable-usage-stats", *args], check=True,
                       env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    outcome["ray_start_s"] = round(time.monotonic() - t0, 1)
    lego = str(bindir / "lego")
    address = f"cluster.ray_address=\"127.0.0.1:{PORT}\""

    def lego_json(name: str, *args: str) -> None:
        t = time.monotonic()
        res = subprocess.run([lego, *args, "--set", address, "--json"], env=env, cwd=work, capture_output=True,
                             text=True, timeout=420)
        outcome[name] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr[-4000:],
                         "seconds": round(time.monotonic() - t, 1)}

    # What the run needs, against what the two nodes have: fits; then one that asks for a GPU and a third node.
    lego_json("validate_fits", "validate", "-c", "lego.toml", "--remote")
    lego_json("validate_short", "validate", "-c", "lego.toml", "--remote", "--set", "cluster.gpus_per_node=1",
              "--set", "cluster.trainer_nodes=3")
    # A placement the cluster cannot hold is refused before any actor starts (5 of 6 CPUs, but 3 nodes).
    lego_json("train_short", "train", "-c", "lego.toml", "--set", "cluster.trainer_nodes=3", "--run-root",
              "runs/short")
    lego_json("train", "train", "-c", "lego.toml")
    # The Megatron backend on the same cluster: TP = 2 across the two nodes' ranks, audited.
    lego_json("train_megatron", "train", "-c", "lego.toml", "--set", "train.backend=\"megatron\"", "--set",
              "train.tensor_parallel=2", "--set", "train.audit=true", "--run-root", "runs/megatron")
    res = subprocess.run([lego, "audit", "runs/megatron", "--json"], env=env, cwd=work, capture_output=True,
                         text=True, timeout=120)
    outcome["audit_megatron"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr[-4000:]}
    # Expert parallelism under Ray: the tiny Qwen3-MoE with its experts split over the two nodes' ranks (EP = 2
    # carved out of DP = 2), audited like the TP run. The random MoE rarely earns a reward: larger groups, and
    # zero-variance groups resampled, so that a step trains.
    lego_json("train_ep", "train", "-c", "lego.toml", "--set", "train.backend=\"megatron\"", "--set",
              "train.expert_parallel=2", "--set", f"model.checkpoint=\"{moe_model}\"", "--set", "train.audit=true",
              "--set", "rollout.batch_size=4", "--set", "rollout.samples_per_prompt=8", "--set",
              "train.oversample_zero_variance=true", "--set", "train.lr=1e-3", "--run-root", "runs/ep")
    res = subprocess.run([lego, "audit", "runs/ep", "--json"], env=env, cwd=work, capture_output=True, text=True,
                         timeout=120)
    outcome["audit_ep"] = {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr[-4000:]}
    (work / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
