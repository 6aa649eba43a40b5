"""The embedded engine's fast path: a dense decoder run over a preallocated KV cache, CUDA graphs per bucket.

``StaticDecoder`` re-expresses a loaded Hugging Face Llama-family decoder (``qwen3``, ``qwen2``, ``llama``: RMSNorm,
RoPE, grouped-query attention, gated SiLU MLP) as plain tensor code reading the model's own parameters, so that:

* **KV lives in preallocated slots.** ``k``/``v`` are ``[layers, slots, kv_heads, max_len, head_dim]``; running
  row ``i`` owns slot ``i`` (rows are kept compact: when a row leaves, the KV of the rows after it moves down). Decode
  writes each row's new key at that row's own position, so rows of any lengths decode together with no padding
  and no per-step reallocation (the python-level cache of ``kv.py`` concatenated and re-sliced every step).
* **One decode step is one CUDA graph.** Captured lazily per (batch bucket, attended-length bucket): batch
  sizes round up to a power of two, the attended length to a power of two >= 128, so a step attends only to
  what the longest row needs and the set of graphs stays small. Between replays only the inputs change.
* **A step's draw inside the graph.** ``decode_draw`` captures the sampler's arithmetic for plain rows
  (``sampler.draw_plain``: no top-k/top-p, at most one alternative) after the forward, so a step is one graph replay and
  one device-to-host copy of ``[b, 5]`` numbers instead of a replay, the sampler's ~20 eager launches and three
  copies. The uniform numbers still come from each request's CPU generator (staged with the token ids: one
  host-to-device copy per step), so a seed samples what ``sample_rows`` samples. The drawn tokens are also
  written to the next step's input buffer, so ``launch_draw`` can queue step n + 1 before step n is read.
* **Small batches decode attention through Triton** (``decode_attention``, CUDA, buckets of at most
  ``TRITON_MAX_ROWS``): the new key/value write and a split attention over each row's own positions in two
  launches, instead of two ``index_put``s and a masked SDPA call; such a graph no longer depends on the attended
  length (one graph per batch bucket). ``attention="sdpa"``, larger buckets, and any device or shape the kernel
  does not take use the SDPA path below.
* **Attention kernels are chosen, not left to SDPA's dispatcher.** cuDNN attention is excluded (it rebuilds its
  graph whenever the shape changes: FIELD-NOTES.md). Prefill from position 0 is causal attention (FlashAttention
  for bf16, the trainer's kernel); decode and prefill after a cached prefix need a per-row length mask, which
  FlashAttention cannot take, so they run memory-efficient attention with the query heads of one KV head
  grouped as that head's queries (no KV duplication for GQA).
* **The trainer's precision, if asked.** ``compute_dtype`` is the dtype of every matmul and of attention; the
  residual stream, norms and RoPE stay in the parameters' dtype. With fp32 parameters and ``compute_dtype =
  bfloat16`` this is exactly what the trainer's forward does under ``torch.autocast(bfloat16)`` (autocast
  casts matmul and attention inputs to bf16 and leaves the rest alone), so engine and trainer compute the same
  function; with bf16 parameters it is the pure-bf16 model ``dtype = "bfloat16"`` loads. The bf16 copies of
  fp32 weights are refreshed in place by ``refresh_weights`` (a captured graph keeps reading the same storage).

Numerically, a forward here is the HF model's forward in the same precision up to kernel order (q/k/v and
gate/up run as one GEMM each, RMSNorm as ``F.rms_norm``): tested on CPU in fp32 against the HF forward, and on
the H200 against the trainer (benchmarks/RESULTS.md). Anything else — sliding-window or MoE layers, scaled RoPE, biases on
o_proj, logit soft-capping — is refused by ``unsupported_reason`` and the engine keeps its generic path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lego_rl.serving import batch_invariant, decode_attention
from lego_rl.serving.sampler import Draw, RowParams, draw_plain, plain_draws, plain_inputs

_FAMILIES = ("qwen3", "qwen2", "llama")
_CAUSAL_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_MASKED_KERNELS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
MIN_LEN_BUCKET = 128
"""Smallest attended length a decode graph is captured for (a multiple of 8, as the masked kernel wants)."""
TRITON_MAX_ROWS = 8
"""Largest batch bucket that decodes through the Triton attention kernel. Its programs are (row, KV head, split)
with the splits there for one row's sake; at 64 rows SDPA's kernel was faster (H200, 0.6B shape: a 4.66 ms
graph against 3.69 ms, benchmarks/RESULTS.md)."""


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalise in fp32, back to the input dtype, times the weight (type promotion as HF).
    ``F.rms_norm`` is one fused kernel on CUDA for the five of ``x * rsqrt(mean(x²) + eps)``."""
    return w * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _qkv_block(h: torch.Tensor, in_norm: torch.Tensor, qkv_w: torch.Tensor, qkv_b: torch.Tensor | None,
               qk_norm: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int,
               eps: float, cdt: torch.dtype, invariant: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer up to attention. ``h`` [N, H], ``cos``/``sin`` [N, 1, D] → q [N, heads, D], k and v [N, Hkv, D] in
    ``cdt``. A free function of tensors and constants, so one ``torch.compile`` of it serves every layer.
    ``invariant``: norms and the matmul through ``batch_invariant`` (``train.true_on_policy``)."""
    n, d = h.shape[0], cos.shape[-1]
    rms = batch_invariant.rms_norm if invariant else _rms
    x = rms(h, in_norm, eps)  # [N, H]
    qkv = (batch_invariant.linear if invariant else F.linear)(x.to(cdt), qkv_w, qkv_b)  # [N, (heads + 2·Hkv)·D]
    heads = n_heads + n_kv
    qk = qkv[:, : heads * d].view(n, heads, d)  # [N, heads + Hkv, D] q then k
    v = qkv[:, heads * d :].view(n, n_kv, d)  # [N, Hkv, D]
    if qk_norm is not None:
        qk = rms(qk, qk_norm, eps)  # [N, heads + Hkv, D] per-head norms of q and k at once
    # HF's x * cos + rotate_half(x) * sin (``sin`` is stored with its first half negated). Type promotion as in
    # HF: a bf16 q times fp32 cos is computed in fp32; attention then takes the compute dtype (autocast's cast
    # of SDPA's inputs).
    qk = (qk * cos + torch.roll(qk, d // 2, dims=-1) * sin).to(cdt)  # [N, heads + Hkv, D]
    return qk[:, :n_heads], qk[:, n_heads:], v  # [N, heads, D], [N, Hkv, D], [N, Hkv, D]


def _rest_block(h: torch.Tensor, attn: torch.Tensor, o_w: torch.Tensor, post_norm: torch.Tensor,
                gate_up: torch.Tensor, down: torch.Tensor, eps: float, cdt: torch.dtype,
                invariant: bool = False) -> torch.Tensor:
    """A layer after attention: residual of ``attn`` [N, heads*D], then the MLP block → [N, H] residual dtype."""
    lin = batch_invariant.linear if invariant else F.linear
    rms = batch_invariant.rms_norm if invariant else _rms
    h = h + lin(attn.to(cdt), o_w)  # [N, H]
    gate, up = lin(rms(h, post_norm, eps).to(cdt), gate_up).chunk(2, dim=-1)  # [N, I] each
    return h + lin(F.silu(gate) * up, down)  # [N, H]


def unsupported_reason(model: Any, config: Any) -> str | None:
    """Why ``model`` cannot run on ``StaticDecoder`` (None when it can)."""
    kind = getattr(config, "model_type", None)
    if kind not in _FAMILIES:
        return f"model_type {kind!r} is not one of {list(_FAMILIES)}"
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if rope_type != "default":
        return f"rope_scaling type {rope_type!r} (only unscaled RoPE)"
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (only silu)"
    if getattr(config, "num_experts", 0) or getattr(config, "num_experts_per_tok", 0):
        return "mixture-of-experts layers"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        return "no model.layers / lm_head"
    attn = layers[0].self_attn
    if getattr(attn.o_proj, "bias", None) is not None:
        return "a bias on o_proj"
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
        return "logit soft-capping"
    return None


def _bucket(n: int, floor: int) -> int:
    b = floor
    while b < n:
        b *= 2
    return b


class StaticDecoder:
    """A decoder forward over preallocated KV slots (see module docstring)."""

    def __init__(self, model: Any, config: Any, *, slots: int, max_len: int, compute_dtype: torch.dtype,
                 use_graphs: bool, compile: bool = False,
                 attention: Literal["auto", "triton", "sdpa"] = "auto", invariant: bool = False) -> None:
        """``compile``: run the decode step's per-layer blocks (everything but the KV write and attention)
        through ``torch.compile`` before the graphs capture them: Inductor fuses the norms, RoPE, casts and the
        SiLU gate into a few kernels per layer (a step is launch-bound). CUDA graphs only; compiling takes
        tens of seconds on the first step of each of two batch shapes (1 row, then >= 2 rows, dynamic).
        ``attention``: the decode step's attention — ``triton`` (``decode_attention``; a ValueError where it
        cannot run), ``sdpa`` (masked memory-efficient SDPA and separate KV writes), ``auto`` = triton where it
        runs. ``invariant``: every matmul, norm and attention through ``batch_invariant`` (``train.true_on_policy``:
        the torch trainer computes each token's logprob bit for bit as here), eagerly: no graphs, no compile."""
        reason = unsupported_reason(model, config)
        if reason is not None:
            raise ValueError(f"the static decode path cannot run this model: {reason}")
        self.model = model
        self.device = next(model.parameters()).device
        self.param_dtype = next(model.parameters()).dtype
        self.compute_dtype = compute_dtype
        self.slots = slots
        self.max_len = max_len
        self.n_heads = int(config.num_attention_heads)
        self.n_kv = int(getattr(config, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_heads)
        self.scale = float(self.head_dim ** -0.5)
        self.eps = float(config.rms_norm_eps)
        self.vocab = int(config.vocab_size)
        layers = model.model.layers
        n_layers = len(layers)
        kv_bytes = self.kv_bytes(config, slots, max_len, compute_dtype)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if kv_bytes > 0.9 * free:
                raise MemoryError(f"the KV cache for max_batch={slots} × max_model_len={max_len} needs "
                                  f"{kv_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB are free: lower "
                                  "max_batch or max_model_len")
        shape = (n_layers, slots, self.n_kv, max_len, self.head_dim)
        self.k = torch.zeros(shape, dtype=compute_dtype, device=self.device)  # [L, S, Hkv, Lmax, D]
        self.v = torch.zeros(shape, dtype=compute_dtype, device=self.device)  # [L, S, Hkv, Lmax, D]
        # Matmul weights in compute dtype: the parameters themselves when the dtypes agree, else copies that
        # ``refresh_weights`` keeps equal to the parameters (autocast's cast, done once per weight version).
        # q/k/v and gate/up are concatenated into one matrix each: one GEMM launch instead of three/two (a
        # decode step is launch-bound: ~1 µs per kernel, thousands of kernels).
        self._copies: list[tuple[list[torch.Tensor], torch.Tensor]] = []
        self._norm_copies: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.layers: list[dict[str, Any]] = []
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            qkv_b = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            self.layers.append({
                "in_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
                "qkv": self._mm(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                "qkv_b": self._mm(*qkv_b) if all(b is not None for b in qkv_b) else None,
                "o": self._mm(a.o_proj.weight),
                "qk_norm": self._stacked_norm(a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else None,
                "gate_up": self._mm(m.gate_proj.weight, m.up_proj.weight),
                "down": self._mm(m.down_proj.weight),
            })
            if any(b is not None for b in qkv_b) and self.layers[-1]["qkv_b"] is None:
                raise ValueError("the static decode path needs biases on all of q/k/v_proj or on none")
        self.embed = model.model.embed_tokens.weight  # [V, H] param dtype (embedding is not autocast)
        self.final_norm = model.model.norm.weight
        self.lm_head = self._mm(model.lm_head.weight)
        bias = getattr(model.lm_head, "bias", None)
        self.lm_head_bias = self._mm(bias) if bias is not None else None
        rotary = model.model.rotary_emb
        inv_freq = rotary.inv_freq.float()  # [D/2]
        # HF computes freqs as an fp32 outer product (one rounding per entry): the same numbers as this.
        freqs = torch.arange(max_len, device=self.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [Lmax, D]
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (emb.cos() * scaling).to(self.param_dtype)  # [Lmax, D] in the residual stream's dtype
        sin = emb.sin() * scaling  # [Lmax, D]
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, D/2) * (sin with its first half negated): negation is exact.
        self.sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(self.param_dtype)  # [Lmax, D]
        self.invariant = invariant
        if invariant and self.device.type == "cuda" and compute_dtype != torch.bfloat16:
            raise ValueError(f"the batch-invariant CUDA kernels compute in bf16, not {compute_dtype}")
        self.use_graphs = use_graphs and self.device.type == "cuda" and not invariant
        compile = compile and not invariant
        self._qkv_compiled: Any = None
        self._rest_compiled: Any = None
        if compile and self.use_graphs:
            # Two free functions of tensors and constants: every layer has the same shapes, so one compile of
            # each serves all layers (guards check shapes and dtypes, not which weight is passed).
            self._qkv_compiled = torch.compile(_qkv_block, fullgraph=True)
            self._rest_compiled = torch.compile(_rest_block, fullgraph=True)
        self._graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = None
        why_not = decode_attention.unsupported_reason(self.device, self.n_heads, self.n_kv, self.head_dim)
        if attention == "triton" and why_not is not None:
            raise ValueError(f"attention='triton' cannot run here: {why_not}")
        self.triton_attention = attention != "sdpa" and why_not is None and not invariant
        # Static decode inputs, staged on the host (pinned on CUDA) and sent with one copy per dtype per step:
        # int64 rows (token ids, positions) and float64 rows (temperatures, uniform numbers).
        pin = self.device.type == "cuda"
        self._in_i = torch.zeros(2, slots, dtype=torch.long, device=self.device)  # [2, S]
        self._in_f = torch.zeros(2, slots, dtype=torch.float64, device=self.device)  # [2, S]
        self._host_i = torch.zeros(2, slots, dtype=torch.long, pin_memory=pin)  # [2, S]
        self._host_f = torch.zeros(2, slots, dtype=torch.float64, pin_memory=pin)  # [2, S]
        self._staged = torch.cuda.Event() if pin else None
        # A launched step's draws come back through one of two pinned buffers (``launch_draw``: the next step may
        # be launched before this one is read).
        self._host_out = torch.zeros(2, slots, 5, dtype=torch.float64, pin_memory=pin)  # [2, S, 5]
        self._flip = 0
        self._ids, self._pos = self._in_i[0], self._in_i[1]  # [S] each
        self._temps, self._u = self._in_f[0], self._in_f[1]  # [S] each
        self._rows = torch.arange(slots, device=self.device)  # [S]

    @staticmethod
    def kv_bytes(config: Any, slots: int, max_len: int, dtype: torch.dtype) -> int:
        """Bytes of the preallocated KV cache for ``slots`` rows of ``max_len`` positions."""
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return 2 * int(config.num_hidden_layers) * slots * kv * max_len * head_dim * dtype.itemsize

    # -- weights -------------------------------------------------------------------------------------

    def _mm(self, *params: torch.Tensor) -> torch.Tensor:
        """The compute-dtype matrix of ``params`` concatenated along dim 0 (the parameter itself when it is one
        already in compute dtype: no copy)."""
        if len(params) == 1 and params[0].dtype == self.compute_dtype:
            return params[0]
        copy = torch.cat([w.detach() for w in params], dim=0).to(self.compute_dtype)
        self._copies.append((list(params), copy))
        return copy

    def _stacked_norm(self, q_norm: torch.Tensor, k_norm: torch.Tensor) -> torch.Tensor:
        """``[heads + Hkv, D]``: q_norm's weight for every query head, then k_norm's for every KV head, so one
        norm call serves q and k (the same per-head arithmetic, half the kernels)."""
        stacked = torch.cat([q_norm.detach().expand(self.n_heads, -1), k_norm.detach().expand(self.n_kv, -1)])
        self._norm_copies.append((q_norm, k_norm, stacked))
        return stacked

    @torch.no_grad()
    def refresh_weights(self) -> None:
        """Re-derive the compute-dtype copies from the parameters, in place (after any weight change)."""
        for q_norm, k_norm, stacked in self._norm_copies:
            stacked[: self.n_heads].copy_(q_norm.expand(self.n_heads, -1))
            stacked[self.n_heads :].copy_(k_norm.expand(self.n_kv, -1))
        for params, copy in self._copies:
            at = 0
            for w in params:
                copy[at : at + w.shape[0]].copy_(w)
                at += w.shape[0]

    # -- the forward ---------------------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (batch_invariant.rms_norm if self.invariant else _rms)(x, w, self.eps)

    def _lin(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return (batch_invariant.linear if self.invariant else F.linear)(x.to(self.compute_dtype), w, b)

    def _qkv(self, p: dict[str, Any], h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fast: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h`` [N, H], ``cos``/``sin`` [N, 1, D] → q [N, heads, D], k and v [N, kv_heads, D] (compute dtype).
        ``fast``: the compiled block when the decoder compiles (decode steps only)."""
        fn = self._qkv_compiled if fast and self._qkv_compiled is not None else _qkv_block
        return fn(h, p["in_norm"], p["qkv"], p["qkv_b"], p["qk_norm"], cos, sin, self.n_heads, self.n_kv,
                  self.eps, self.compute_dtype, self.invariant)

    def _rest(self, p: dict[str, Any], h: torch.Tensor, attn: torch.Tensor, fast: bool = False) -> torch.Tensor:
        """Residual after attention ``attn`` [N, heads*D], then the MLP block: [N, H] in the residual dtype."""
        fn = self._rest_compiled if fast and self._rest_compiled is not None else _rest_block
        return fn(h, attn, p["o"], p["post_norm"], p["gate_up"], p["down"], self.eps, self.compute_dtype,
                  self.invariant)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` [N, H] → fp32 logits [N, V]."""
        return self._lin(self._norm(h, self.final_norm), self.lm_head, self.lm_head_bias).float()  # [N, V]

    def _decode_body(self, b: int, span: int, draw: bool = False) -> torch.Tensor:
        """One token for rows 0..b-1 (inputs in ``_ids``/``_pos``), attending to ``span`` positions (0: through
        the Triton kernel, which reads each row's own): [b, V] logits, or with ``draw`` the rows' draws ``[b, 5]``
        (``draw_plain`` over ``_temps``/``_u``)."""
        ids, pos, rows = self._ids[:b], self._pos[:b], self._rows[:b]  # [b]
        h = F.embedding(ids, self.embed)  # [b, H]
        if self.invariant:
            return self._out(self._logits(self._invariant_layers(h, pos, rows, self._host_i[1, :b].tolist())),
                             b, draw)
        if span == 0:
            cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [b, 1, D]
            for i, p in enumerate(self.layers):
                q, k, v = self._qkv(p, h, cos, sin, fast=True)
                out = decode_attention.decode_attention(q, k, v, self.k[i], self.v[i], pos, self.scale)
                h = self._rest(p, h, out.reshape(b, self.n_heads * self.head_dim), fast=True)
            return self._out(self._logits(h), b, draw)
        group = self.n_heads // self.n_kv
        seen = torch.arange(span, device=self.device)[None, :] <= pos[:, None]  # [b, span]
        # Additive, in the attention dtype, built once per step (a boolean mask is converted in every layer).
        mask = torch.zeros(b, 1, 1, span, dtype=self.compute_dtype, device=self.device).masked_fill_(
            ~seen[:, None, None, :], float("-inf"))  # [b, 1, 1, span]
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [b, 1, D]
        with sdpa_kernel(_MASKED_KERNELS):
            for i, p in enumerate(self.layers):
                q, k, v = self._qkv(p, h, cos, sin, fast=True)
                self.k[i][rows, :, pos] = k  # [b, Hkv, D] at each row's own position
                self.v[i][rows, :, pos] = v
                qg = q.view(b, self.n_kv, group, self.head_dim)  # [b, Hkv, G, D] a KV head's queries
                out = F.scaled_dot_product_attention(qg, self.k[i, :b, :, :span], self.v[i, :b, :, :span],
                                                     attn_mask=mask, scale=self.scale)  # [b, Hkv, G, D]
                h = self._rest(p, h, out.reshape(b, self.n_heads * self.head_dim), fast=True)
        return self._out(self._logits(h), b, draw)

    def _invariant_layers(self, h: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, positions: list[int]
                          ) -> torch.Tensor:
        """Invariant mode: one new token per row (``h`` [b, H] at ``pos`` [b] of ``slots`` [b] = rows 0..b-1, the
        same ``positions`` on the host) through every layer; its KV is written first, then it attends to its slot's
        positions ``0..pos`` (``batch_invariant.attention_cached``). The last hidden state [b, H]."""
        b = h.shape[0]
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [b, 1, D]
        seqs = [(i, i, 1, p) for i, p in enumerate(positions)]  # row i owns slot i
        for i, p in enumerate(self.layers):
            q, k, v = self._qkv(p, h, cos, sin)
            self.k[i][slots, :, pos] = k  # [b, Hkv, D] at each row's own position
            self.v[i][slots, :, pos] = v
            out = batch_invariant.attention_cached(q, self.k[i], self.v[i], seqs, self.scale)  # [b, heads, D]
            h = self._rest(p, h, out.reshape(b, self.n_heads * self.head_dim))
        return h

    def _out(self, logits: torch.Tensor, b: int, draw: bool) -> torch.Tensor:
        """A step's result: ``logits`` [b, V], or the rows' draws [b, 5] — whose tokens are also written to
        ``_ids`` as the next step's inputs, so a step can be launched before the host has read this one."""
        if not draw:
            return logits
        packed = draw_plain(logits, self._temps[:b], self._u[:b])  # [b, 5]
        self._ids[:b].copy_(packed[:, 0].long())
        return packed

    def _stage(self, ids: list[int] | None, positions: list[int], bb: int, temps: list[float] | None = None,
               u: list[float] | None = None) -> None:
        """Copy a step's inputs to the static buffers (rows ``b..bb-1`` are padding: a dummy token at position 0
        of a free slot, temperature 0, whose outputs are ignored). ``ids`` None: the previous step's draws,
        which its graph left in ``_ids``."""
        b = len(positions)
        if self._staged is not None:
            self._staged.synchronize()  # the previous step's copy has read the pinned buffer
        hi, hf = self._host_i.numpy(), self._host_f.numpy()
        hi[1, :b], hi[:, b:bb] = positions, 0
        if ids is None:
            self._in_i[1, :bb].copy_(self._host_i[1, :bb], non_blocking=True)
        else:
            hi[0, :b] = ids
            self._in_i[:, :bb].copy_(self._host_i[:, :bb], non_blocking=True)
        if temps is not None and u is not None:
            hf[0, :b], hf[1, :b], hf[:, b:bb] = temps, u, 0.0
            self._in_f[:, :bb].copy_(self._host_f[:, :bb], non_blocking=True)
        if self._staged is not None:
            self._staged.record()

    def _run(self, ids: list[int] | None, positions: list[int], draw: bool, temps: list[float] | None = None,
             u: list[float] | None = None) -> torch.Tensor:
        b = len(positions)
        bb = min(_bucket(b, 1), self.slots) if self.use_graphs else b
        # The Triton kernel reads each row's own positions: its graphs do not depend on the attended length.
        triton = self.triton_attention and bb <= TRITON_MAX_ROWS
        span = 0 if triton else min(_bucket(max(positions) + 1, MIN_LEN_BUCKET), self.max_len)
        self._stage(ids, positions, bb, temps, u)
        if not self.use_graphs:
            return self._decode_body(b, span, draw)
        graph = self._graphs.get((bb, span, draw))
        if graph is None:
            graph = self._capture(bb, span, draw)
        graph[0].replay()
        return graph[1][:b]

    @torch.inference_mode()
    def decode(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each running row ``i`` (slot ``i``) at ``positions[i]``: fp32 logits [b, V]."""
        return self._run(ids, positions, draw=False)

    @torch.inference_mode()
    def decode_draw(self, ids: list[int], positions: list[int], rows: list[RowParams]) -> list[Draw]:
        """``decode`` and the draw of plain ``rows`` (``sampler.is_plain``) in one graph: each row's sampled
        token, its logprob, rank and most likely alternative, after one device-to-host copy. Takes each row's
        uniform number from its generator (``plain_inputs``)."""
        return plain_draws(self._run(ids, positions, True, *plain_inputs(rows)).tolist(), rows)

    @torch.inference_mode()
    def launch_draw(self, ids: list[int] | None, positions: list[int], rows: list[RowParams]
                    ) -> Callable[[], list[Draw]]:
        """``decode_draw`` without waiting: queues the step and returns the function that waits for its draws.
        ``ids`` None decodes the tokens the previous step drew (still on the device), so the next step can be
        queued before this one is read. Each row's uniform number is taken from its generator now."""
        packed = self._run(ids, positions, True, *plain_inputs(rows))  # [b, 5] on the device
        b = len(positions)
        if self._staged is None:  # CPU: computed already
            ready = packed.tolist()
            return lambda: plain_draws(ready, rows)
        buf = self._host_out[self._flip, :b]  # [b, 5] pinned
        self._flip ^= 1
        buf.copy_(packed, non_blocking=True)  # before the next replay overwrites the graph's output
        done = torch.cuda.Event()
        done.record()

        def collect() -> list[Draw]:
            done.synchronize()
            return plain_draws(buf.tolist(), rows)

        return collect

    def _capture(self, b: int, span: int, draw: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm-up outside the graph (kernel selection, lazy init). They write the KV of each row's position, as the
        # replay does again; a draw also writes its tokens to ``_ids``, which the replay must not see: restored.
        inputs = self._ids.clone()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._decode_body(b, span, draw)
                self._ids.copy_(inputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._decode_body(b, span, draw)
        self._graphs[(b, span, draw)] = (graph, out)
        return graph, out

    @torch.inference_mode()
    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Run ``ids`` at positions ``start..`` of ``slot`` (positions before ``start`` already hold KV):
        writes their KV, returns the last position's fp32 logits [1, V]."""
        t = len(ids)
        end = start + t
        if end > self.max_len:
            raise ValueError(f"{end} positions exceed the static cache's {self.max_len}")
        pos = torch.arange(start, end, device=self.device)  # [T]
        h = F.embedding(torch.tensor(ids, device=self.device), self.embed)  # [T, H]
        group = self.n_heads // self.n_kv
        mask = None
        if start:
            mask = torch.arange(end, device=self.device)[None, :] <= pos[:, None]  # [T, end] causal after prefix
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [T, 1, D]
        for i, p in enumerate(self.layers):
            q, k, v = self._qkv(p, h, cos, sin)
            self.k[i, slot, :, start:end] = k.transpose(0, 1)  # [Hkv, T, D]
            self.v[i, slot, :, start:end] = v.transpose(0, 1)
            if self.invariant:
                out2 = batch_invariant.attention_cached(q, self.k[i], self.v[i], [(slot, 0, t, start)], self.scale)
                h = self._rest(p, h, out2.reshape(t, self.n_heads * self.head_dim))  # [T, H]
                continue
            keys = self.k[i, slot, :, :end].repeat_interleave(group, dim=0)  # [heads, end, D]
            vals = self.v[i, slot, :, :end].repeat_interleave(group, dim=0)  # [heads, end, D]
            with sdpa_kernel(_MASKED_KERNELS if start else _CAUSAL_KERNELS):
                out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0),
                                                     vals.unsqueeze(0), attn_mask=mask, is_causal=not start,
                                                     scale=self.scale)  # [1, heads, T, D]
            h = self._rest(p, h, out[0].transpose(0, 1).reshape(t, self.n_heads * self.head_dim))
        return self._logits(h[-1:])

    @torch.inference_mode()
    def prefill_rows(self, slot: int, prompts: list[list[int]]) -> torch.Tensor:
        """Prefill ``prompts`` from position 0 into slots ``slot``, ``slot + 1``, ... as one batch: fp32 logits of
        each prompt's last position [n, V].

        The prompts are right-padded to the longest; under causal attention a real position attends only to
        positions before it, all real, so padding changes nothing it computes. The padding's KV lands at
        positions a row's decode overwrites before its mask lets it be attended to."""
        n, t = len(prompts), max((len(ids) for ids in prompts), default=0)
        if n == 0 or min(len(ids) for ids in prompts) == 0:
            raise ValueError("prefill_rows needs at least one prompt and no empty prompt")
        if slot + n > self.slots:
            raise ValueError(f"slots {slot}..{slot + n - 1} exceed the static cache's {self.slots} slots")
        if t > self.max_len:
            raise ValueError(f"a {t}-token prompt exceeds the static cache's {self.max_len} positions")
        padded = torch.zeros(n, t, dtype=torch.long)  # [n, T] right-padded with id 0
        for i, ids in enumerate(prompts):
            padded[i, : len(ids)] = torch.tensor(ids)
        last = torch.tensor([len(ids) - 1 for ids in prompts], device=self.device)  # [n]
        h = F.embedding(padded.to(self.device).view(-1), self.embed)  # [n·T, H]
        cos = self.cos[:t].repeat(n, 1).unsqueeze(1)  # [n·T, 1, D] positions 0..T-1 per row
        sin = self.sin[:t].repeat(n, 1).unsqueeze(1)  # [n·T, 1, D]
        d, hkv = self.head_dim, self.n_kv
        if self.invariant:
            seqs = [(slot + i, i * t, len(ids), 0) for i, ids in enumerate(prompts)]  # padding rows unused
            for i, p in enumerate(self.layers):
                q, k, v = self._qkv(p, h, cos, sin)  # [n·T, heads, D], [n·T, Hkv, D], [n·T, Hkv, D]
                self.k[i, slot : slot + n, :, :t] = k.view(n, t, hkv, d).transpose(1, 2)  # [n, Hkv, T, D]
                self.v[i, slot : slot + n, :, :t] = v.view(n, t, hkv, d).transpose(1, 2)
                out = batch_invariant.attention_cached(q, self.k[i], self.v[i], seqs, self.scale)  # [n·T, heads, D]
                h = self._rest(p, h, out.reshape(n * t, self.n_heads * d))  # [n·T, H]
            return self._logits(h.view(n, t, -1)[torch.arange(n, device=self.device), last])  # [n, V]
        with sdpa_kernel(_CAUSAL_KERNELS):
            for i, p in enumerate(self.layers):
                q, k, v = self._qkv(p, h, cos, sin)  # [n·T, heads, D], [n·T, Hkv, D], [n·T, Hkv, D]
                k4 = k.view(n, t, hkv, d).transpose(1, 2)  # [n, Hkv, T, D]
                v4 = v.view(n, t, hkv, d).transpose(1, 2)  # [n, Hkv, T, D]
                self.k[i, slot : slot + n, :, :t] = k4
                self.v[i, slot : slot + n, :, :t] = v4
                group = self.n_heads // hkv
                out = F.scaled_dot_product_attention(q.view(n, t, self.n_heads, d).transpose(1, 2),
                                                     k4.repeat_interleave(group, dim=1),  # [n, heads, T, D]
                                                     v4.repeat_interleave(group, dim=1),  # [n, heads, T, D]
                                                     is_causal=True, scale=self.scale)  # [n, heads, T, D]
                h = self._rest(p, h, out.transpose(1, 2).reshape(n * t, self.n_heads * d))  # [n·T, H]
        return self._logits(h.view(n, t, -1)[torch.arange(n, device=self.device), last])  # [n, V]

    # -- slots ---------------------------------------------------------------------------------------

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (row compaction)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    def slot_kv(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of slot ``slot``'s first ``length`` positions, per layer ``([1, Hkv, n, D], [1, Hkv, n, D])``."""
        return [(self.k[i, slot : slot + 1, :, :length], self.v[i, slot : slot + 1, :, :length])
                for i in range(len(self.layers))]

    def load_kv(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a cached prefix ``kv`` (per layer ``[1, Hkv, n, D]``) into the start of ``slot``."""
        for i, (k, v) in enumerate(kv):
            n = k.shape[2]
            self.k[i, slot, :, :n].copy_(k[0])
            self.v[i, slot, :, :n].copy_(v[0])
