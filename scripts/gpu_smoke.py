#!/usr/bin/env python3
"""Multi-GPU smoke run: two synchronous GRPO steps with the Megatron backend under torchrun, audited end to end.

The layout of the reference example's GPU CI, on one host (docs/cluster.md, "Multi-GPU smoke run"):

* trainer ranks on the first ``--trainer-gpus`` GPUs: ``torchrun -m lego_rl train`` with ``train.backend =
  "megatron"``, ``train.tensor_parallel = --tp`` (DP = trainer GPUs / TP);
* engines on the other GPUs: one ``lego serve`` per GPU (fp32 weights, bf16 compute: the trainer's recipe),
  each writing its served tokens into the run's ``audit/``; with no GPU left for engines, the embedded engine
  shares trainer rank 0's GPU;
* a Qwen3-architecture model of random weights built here, offline (``--shape``; 1.4B parameters by default),
  with the tiny model's tokenizer and chat template; the built-in ``first_letter`` environment, 2 prompts × 4
  samples per step (zero-variance groups replaced, so both steps carry signal), ``train.audit = true``;
* afterwards ``lego audit`` over the run directory: its checks and figures, and ``summary.md`` beside it.

    python3 scripts/gpu_smoke.py --out /tmp/smoke                      # 8 GPUs: TP2×DP2 + 4 engines
    python3 scripts/gpu_smoke.py --out /tmp/smoke --trainer-gpus 2 --engine-gpus 0   # 2 GPUs
    python3 scripts/gpu_smoke.py --out /tmp/smoke --cpu                 # gloo dry run (the CI test)

Exit code: the audit's (0 every check passed, 1 a check failed), 3 when a stage failed before the audit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, int]] = {
    # Qwen3-1.7B's layer shape with the tiny tokenizer's vocabulary: 1.41B parameters, nearly all in the layers.
    "1.4b": dict(num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=6144),
    # Qwen3-0.6B's layer shape: 0.44B parameters.
    "0.4b": dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072),
    # The tiny model itself (CPU dry run).
    "tiny": {},
}


def log(msg: str) -> None:
    print(f"[gpu_smoke {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lego(*args: str) -> list[str]:
    return [sys.executable, "-m", "lego_rl", *args]


def build_model(out: Path, shape: str, *, device: str) -> Path:
    """The tiny model's tokenizer and template with a ``shape`` body of random weights (bf16 file)."""
    from lego_rl.serving.tiny_model import ensure_tiny_model

    tiny = ensure_tiny_model()
    if not SHAPES[shape]:
        return tiny
    import torch
    from safetensors.torch import save_file

    model = out / f"qwen3-{shape}"
    if (model / "model.safetensors").is_file():
        return model
    tmp = out / f".qwen3-{shape}.build"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(tiny, tmp, ignore=shutil.ignore_patterns("model*.safetensors", "*.index.json"))
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.update(SHAPES[shape], tie_word_embeddings=True, dtype="bfloat16")
    cfg["layer_types"] = ["full_attention"] * cfg["num_hidden_layers"]  # transformers checks one per layer
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    h, d, ffn = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    heads, kv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*dims: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen, device=device) * std).to(torch.bfloat16).cpu()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    state = {"model.embed_tokens.weight": rand(vocab, h, std=0.05), "model.norm.weight": ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state |= {p + "self_attn.q_proj.weight": rand(heads * d, h), p + "self_attn.k_proj.weight": rand(kv * d, h),
                  p + "self_attn.v_proj.weight": rand(kv * d, h), p + "self_attn.o_proj.weight": rand(h, heads * d),
                  p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d),
                  p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                  p + "mlp.gate_proj.weight": rand(ffn, h), p + "mlp.up_proj.weight": rand(ffn, h),
                  p + "mlp.down_proj.weight": rand(h, ffn)}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "lego_tiny_model.json").unlink(missing_ok=True)  # not the tiny model any more
    tmp.rename(model)
    return model


def write_config(work: Path, model: Path, *, tp: int, trainer_gpus: int, engine_urls: list[str], cpu: bool,
                 steps: int, samples: int, sequence_parallel: bool = False) -> Path:
    from lego_rl.driver.toy_env import make_rows

    (work / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(16, letters="ab")))
    serving = (f'backend = "vllm"\nurls = {json.dumps(engine_urls)}\n' if engine_urls else
               f'backend = "embedded"\ndevice = "{"cpu" if cpu else "cuda"}"\nport = 0\n')
    # A short context: the GPU engine's fast path preallocates KV for max_batch × context and falls back to the
    # generic (slow) decode when that exceeds a quarter of free memory (65,536 positions did, on the x2 run).
    text = f"""[model]
checkpoint = "{model}"
dtype = "{"float32" if cpu else "auto"}"
max_context_tokens = 4096
max_response_tokens = 64

[serving]
{serving}
[sandbox]
provider = "bwrap"

[rollout]
prompt_data = "toy.jsonl"
batch_size = 2
samples_per_prompt = {samples}
max_staleness = 0
top_p = 1.0

[train]
environment = "first_letter"
environment_options = {{ max_tokens = 8 }}
num_rollout = {steps}
backend = "megatron"
tensor_parallel = {tp}
sequence_parallel = {"true" if sequence_parallel else "false"}
lr = 1e-4
max_grad_norm = 1.0
audit = true
oversample_zero_variance = true

[cluster]
gpus_per_node = {trainer_gpus}

[paths]
run_root = "run"
"""
    (work / "lego.toml").write_text(text)
    return work / "lego.toml"


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine at {url} exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"engine at {url} not healthy after {timeout:.0f} s")


def summary_md(report: dict[str, Any], layout: str, walls: dict[str, float]) -> str:
    lines = [f"Layout: {layout}. Wall: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()) + ".", "",
             "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'pass' if c['passed'] else 'FAIL'} | {c['detail']} |" for c in report["checks"]]
    fig = report["figures"]
    lines += ["", f"Parameters {fig.get('parameters')}, trainer ranks {fig.get('trainer_ranks')}.", "",
              "| step | reward | rollout s | train s | sync s | seq tokens | model TFLOP/s/GPU | Pearson | mean abs Δ | max abs Δ |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for step, v in fig["steps"].items():
        def g(k: str, f: str = ".3f") -> str:
            return format(v[k], f) if k in v else "-"
        lines.append(f"| {step} | {g('reward_mean')} | {g('time_rollout_s', '.2f')} | {g('time_train_s', '.2f')} | "
                     f"{g('time_sync_s', '.2f')} | {g('sequence_tokens', '.0f')} | {g('model_tflops_per_gpu', '.2f')} | "
                     f"{g('consistency/pearson', '.6f')} | {g('consistency/mean_abs_diff', '.5f')} | "
                     f"{g('consistency/max_abs_diff', '.4f')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="Work folder (model, config, run directory).")
    ap.add_argument("--trainer-gpus", type=int, default=4)
    ap.add_argument("--engine-gpus", type=int, default=4, help="0: the embedded engine on trainer rank 0's GPU.")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--sequence-parallel", action="store_true", help="train.sequence_parallel (needs --tp > 1).")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.4b")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4, help="Samples per prompt (2 prompts per step).")
    ap.add_argument("--cpu", action="store_true", help="gloo ranks and CPU engines with the tiny model (dry run).")
    ap.add_argument("--timeout", type=float, default=1800, help="Seconds for the whole training run.")
    args = ap.parse_args()
    if args.cpu:
        args.shape = "tiny" if args.shape == "1.4b" else args.shape
    work = args.out.resolve()
    if (work / "run").exists():
        sys.exit(f"{work / 'run'} exists: runs are never overwritten; choose a new --out")
    work.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    t0 = time.monotonic()
    model = build_model(work, args.shape, device="cpu" if args.cpu else "cuda")
    walls["model build"] = time.monotonic() - t0
    log(f"model {model}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "SWE_", "ADAPTER_"))
           and k not in {"PROMPT_DATA", "RUN_ROOT", "RUN_LOG", "HF_CHECKPOINT", "DATA_ROOT"}}
    engines: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        t0 = time.monotonic()
        for e in range(args.engine_gpus):
            gpu = args.trainer_gpus + e
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            eng_env = env if args.cpu else {**env, "CUDA_VISIBLE_DEVICES": str(gpu)}
            cmd = lego("serve", "--model", str(model), "--port", str(port), "--device", "cpu" if args.cpu else "cuda",
                       "--precision", "weights" if args.cpu else "trainer",
                       "--served-log", str(work / "run" / "audit" / f"engine-{e}.jsonl"))
            engines.append(subprocess.Popen(cmd, env=eng_env, stdout=(work / f"engine-{e}.log").open("ab"),
                                            stderr=subprocess.STDOUT))
            urls.append(url)
        for url, proc in zip(urls, engines, strict=True):
            wait_healthy(url, proc, timeout=600)
        walls["engines up"] = time.monotonic() - t0
        sp = ", sequence parallel" if args.sequence_parallel else ""
        layout = (f"{args.trainer_gpus} trainer rank(s) (Megatron TP={args.tp} × DP={args.trainer_gpus // args.tp}{sp})"
                  + (f", {len(urls)} `lego serve` engine(s)" if urls else ", the embedded engine on rank 0's device")
                  + (" on CPU (gloo)" if args.cpu else " on GPUs") + f", model {args.shape}")
        log(layout)
        config = write_config(work, model, tp=args.tp, trainer_gpus=args.trainer_gpus, engine_urls=urls,
                              cpu=args.cpu, steps=args.steps, samples=args.samples,
                              sequence_parallel=args.sequence_parallel)
        tr_env = env if args.cpu else {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(args.trainer_gpus)))}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={args.trainer_gpus}",
               "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "lego_rl", "train", "-c", str(config),
               "--json"]
        t0 = time.monotonic()
        with (work / "train.log").open("ab") as train_log:
            proc = subprocess.run(cmd, cwd=work, env=tr_env, stdout=train_log, stderr=subprocess.STDOUT,
                                  timeout=args.timeout)
        walls["lego train"] = time.monotonic() - t0
        if proc.returncode != 0:
            tail = (work / "train.log").read_text(errors="replace")[-4000:]
            log(f"lego train exited {proc.returncode}:\n{tail}")
            return 3
    finally:
        for p in engines:
            p.terminate()
        for p in engines:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    res = subprocess.run(lego("audit", str(work / "run"), "--json"), cwd=work, env=env, capture_output=True,
                         text=True)
    if res.returncode not in (0, 1):
        log(f"lego audit exited {res.returncode}: {res.stderr[-2000:]}")
        return 3
    report = json.loads(res.stdout)
    text = summary_md(report, layout, walls)
    (work / "summary.md").write_text(text)
    print(text, flush=True)
    log(f"audit {'passed' if report['passed'] else 'FAILED'}: {work / 'run' / 'audit'}")
    return int(res.returncode)


if __name__ == "__main__":
    raise SystemExit(main())
