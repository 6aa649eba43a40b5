"""lego's embedded engine: any local HF causal-LM directory, CPU or one GPU, batched decoding.

``EmbeddedEngine`` runs one scheduler task. Each step, in a dedicated worker thread (torch releases the
GIL, so the event loop stays responsive): finished rows leave the batch (their KV goes to the prefix
cache), every running row decodes one token in a single batched forward, and newly arrived requests are
prefilled (reusing a cached prefix when one matches) and join the batch: continuous batching.
Sampling and the logprob convention live in ``sampler.py``; HTTP lives in ``server.py``.

On CUDA (or when asked with ``fast=True``) a dense Llama-family model decodes on ``StaticDecoder``
(``static_decode.py``): KV in preallocated per-row slots, each decode step one CUDA graph per batch/length
bucket, attention kernels chosen explicitly (no cuDNN). Other models, and MoE routing capture, use the generic
path: the transformers model with a python-level batch cache (``kv.py``). Both share scheduling, the prefix
cache and the sampler. ``compute_dtype`` (e.g. fp32 weights, bf16 compute) runs the trainer's autocast recipe
on either path, so engine and trainer compute the same function (docs/serving.md).

Weights can be replaced between steps, from a checkpoint directory (``reload_weights``), an in-process
state dict (``load_state_dict``) or a stream of named tensors (``update_weights``, what weight sync uses);
every sampled token records the version label current at its step. After any weight change the prefix
cache is emptied, and rows frozen mid-generation by ``pause("keep")`` get their KV recomputed under the new
weights before they decode again (as vLLM preempts running requests when it resets its cache): no KV
computed by old weights is ever attended to by new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.errors import WeightUpdateRejected
from lego_rl.serving.kv import BatchCache, PrefixCache, kv_of, new_cache
from lego_rl.serving.output import EngineBadRequest, EngineOutput
from lego_rl.serving.protocol import SamplingParams
from lego_rl.serving.request_check import context_message
from lego_rl.serving.routing import RouterRecorder
from lego_rl.serving import batch_invariant
from lego_rl.serving.sampler import LogSoftmax, RowParams, is_plain, sample_rows
from lego_rl.serving.static_decode import StaticDecoder, unsupported_reason
from lego_rl.serving.weights import DTYPES, load_checkpoint_into, load_model

log = logging.getLogger(__name__)

INITIAL_VERSION = "default"
"""The label of the weights loaded at start (vLLM's label; the client maps it to version 0)."""


def engine_precision(device: str, model_dtype: str, precision: str,
                     trainer_precision: str = "bf16") -> tuple[str, str | None]:
    """``(dtype, compute_dtype)`` for the engine from ``model.dtype``, ``serving.precision`` and the trainer's
    ``train.precision`` (schema.py).

    ``trainer`` is the torch trainer's recipe: fp32 weights with bf16 matmuls and attention on CUDA (its
    autocast) when ``train.precision`` is bf16, fp32 throughout when it is fp32 or on CPU. ``weights`` computes
    in the model dtype (``auto``: bf16 on CUDA, fp32 on CPU). ``auto`` is ``trainer`` on CUDA unless a model
    dtype was chosen explicitly.
    """
    if precision == "trainer" or (precision == "auto" and device.startswith("cuda") and model_dtype == "auto"):
        # The trainer in fp32 samples nothing in bf16: "trainer" must mean what the trainer computes.
        autocast = device.startswith("cuda") and trainer_precision == "bf16"
        return "float32", ("bfloat16" if autocast else None)
    if model_dtype == "auto":
        return ("bfloat16" if device.startswith("cuda") else "float32"), None
    return model_dtype, None


@dataclass
class _Req:
    out: EngineOutput
    prompt: list[int]
    max_tokens: int
    stop_ids: set[int]
    eos_ids: set[int]
    row: RowParams
    future: asyncio.Future[EngineOutput]
    aborted: bool = False


class EmbeddedEngine:
    """Batched generation over a transformers causal LM (see module docstring)."""

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", dtype: str = "float32",
                 max_batch: int = 16, max_model_len: int | None = None, prefix_cache_entries: int = 8,
                 prefill_chunk: int = 2048, name: str | None = None, threads: int | None = None,
                 return_routed_experts: bool = False, fast: bool | None = None,
                 compute_dtype: str | None = None, cuda_graphs: bool = True, compile_decode: bool = False,
                 prefill_batch_tokens: int = 16384, graph_sampling: bool = True,
                 decode_attention: str = "auto", lookahead: bool = True, true_on_policy: bool = False) -> None:
        """``fast``: decode on ``StaticDecoder`` (None: whenever the device is CUDA and the model fits it; True:
        required, a ConfigError says why not). ``compute_dtype``: the dtype of matmuls and attention when it
        differs from the weights' ``dtype`` — ``dtype="float32", compute_dtype="bfloat16"`` is the torch
        trainer's recipe on CUDA (fp32 master weights under bf16 autocast); None = ``dtype``. ``compile_decode``:
        the fast path's decode blocks go through ``torch.compile`` before graph capture (StaticDecoder).
        ``prefill_batch_tokens``: the fast path prefills requests admitted together (and with no cached
        prefix) as one right-padded batch of at most this many positions. ``graph_sampling``: the fast path
        samples a step whose rows are all plain (no top-k/top-p or nucleus, at most one alternative) inside its decode graph
        (``StaticDecoder.decode_draw``; False = always ``sample_rows`` after the graph). ``decode_attention``:
        the fast path's decode attention (``auto``, ``triton``, ``sdpa``: StaticDecoder's ``attention``).
        ``lookahead``: within a burst of such in-graph draws, queue the next step before reading this one (its
        input tokens are the draws the graph left on the device), so the host's work per step overlaps the GPU's;
        a row that finished meanwhile ignores the look-ahead step's draw (``_decode_ahead``). ``true_on_policy``
        (``train.true_on_policy``): the fast path in its batch-invariant mode (``StaticDecoder(invariant=True)``,
        eager: no CUDA graphs, no compile, the draw outside the graph) and the sampler's log-softmax through
        ``batch_invariant.log_softmax``, so each sampled token's logprob is what the torch trainer computes for
        it bit for bit; a model the fast path cannot run is a ConfigError."""
        if threads:
            # Process-wide. On a crowded CPU one thread is often faster than two (no OpenMP spinning).
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.model, self.config, eos = load_model(self.model_dir, self.device, dtype)
        if compute_dtype is not None and compute_dtype not in DTYPES:
            raise ConfigError(f"compute_dtype {compute_dtype!r} is not one of {sorted(DTYPES)}",
                              parameter="compute_dtype", value=compute_dtype)
        self.compute_dtype = DTYPES[compute_dtype or dtype]
        self._autocast = self.compute_dtype != DTYPES[dtype]
        self.vocab_size = int(self.config.vocab_size)
        self.max_model_len = max_model_len or int(getattr(self.config, "max_position_embeddings", 4096))
        self.eos_ids = eos
        self.name = name or self.model_dir.name
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefill_batch_tokens = prefill_batch_tokens
        self.version = INITIAL_VERSION
        self.experts_per_token = int(getattr(self.config, "num_experts_per_tok", 0) or 0)
        if return_routed_experts and not self.experts_per_token:
            raise ConfigError(f"{self.model_dir} is not a mixture-of-experts model (no num_experts_per_tok): "
                              "it has no routed experts to return", parameter="return_routed_experts")
        self.return_routed_experts = return_routed_experts
        self._routes: RouterRecorder | None = None
        if return_routed_experts:
            try:
                self._routes = RouterRecorder(self.model, self.experts_per_token)
            except ValueError as exc:
                raise ConfigError(f"{self.model_dir}: {exc}", parameter="return_routed_experts") from None
        # Routing is recorded per forwarded token; a reused prefix would lack it, so no prefix cache then.
        self.prefix_cache = PrefixCache(max_entries=0 if return_routed_experts else prefix_cache_entries)
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters \
            else "past_key_values"
        self._batch = BatchCache(self.config)
        self._static: StaticDecoder | None = None
        reason = "return_routed_experts is set" if return_routed_experts else unsupported_reason(self.model,
                                                                                                 self.config)
        self.true_on_policy = true_on_policy
        self._log_softmax: LogSoftmax | None = None
        if true_on_policy:
            if reason is not None:
                raise ConfigError(f"train.true_on_policy needs the engine's fast path, which cannot run "
                                  f"{self.model_dir}: {reason}", parameter="true_on_policy")
            fast, cuda_graphs, compile_decode, graph_sampling, lookahead = True, False, False, False, False
            self._log_softmax = batch_invariant.log_softmax
        if fast is None:
            fast = self.device.type == "cuda" and reason is None
            if fast:
                # Slots are preallocated at full context: on its own the engine takes at most a quarter of
                # the free memory (a trainer usually shares the GPU), else it keeps the generic path.
                need = StaticDecoder.kv_bytes(self.config, max_batch, self.max_model_len, self.compute_dtype)
                free, _ = torch.cuda.mem_get_info(self.device)
                if need > free // 4:
                    fast = False
                    log.warning("embedded engine: generic decode path — the fast path's KV cache for %d rows × "
                                "%d positions needs %.1f GiB, over a quarter of the %.1f GiB free (lower "
                                "max_model_len or max_batch, or pass fast=True)", max_batch, self.max_model_len,
                                need / 2**30, free / 2**30)
        if fast:
            if reason is not None:
                raise ConfigError(f"{self.model_dir} cannot use the fast decode path: {reason}", parameter="fast")
            try:
                self._static = StaticDecoder(self.model, self.config, slots=max_batch, max_len=self.max_model_len,
                                             compute_dtype=self.compute_dtype, use_graphs=cuda_graphs,
                                             compile=compile_decode, attention=decode_attention,  # type: ignore[arg-type]
                                             invariant=true_on_policy)
            except MemoryError as exc:
                raise ConfigError(str(exc), parameter="max_batch") from None
            except ValueError as exc:
                raise ConfigError(str(exc), parameter="true_on_policy" if true_on_policy else "decode_attention",
                                  value=true_on_policy if true_on_policy else decode_attention) from None
        self.graph_sampling = graph_sampling
        self.lookahead = lookahead
        log.info("embedded engine: %s decode path, weights %s, compute %s", "fast" if self._static else "generic",
                 dtype, self.compute_dtype)
        self._lengths: list[int] = []
        """Fast path: KV positions held in each running row's slot (row i owns slot i)."""
        self._rows: list[_Req] = []
        self._waiting: list[_Req] = []
        self._by_id: dict[str, _Req] = {}
        self._paused = False
        self._draining = False
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lego-engine")
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._interrupt = False
        self.weights_damaged: str | None = None
        """Why the weights are a mix of two versions (an update failed half-way); None when they are whole.
        A damaged engine stays paused until a complete update succeeds."""
        self.burst = 16
        """Most decode steps the worker runs per scheduler round (bounds the wait of a new arrival to one
        step: arrivals end the burst at once; this only bounds lock holders such as weight reloads)."""
        self.steps = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="lego-engine-loop")

    async def stop(self) -> None:
        """Abort everything still running and stop the scheduler."""
        for req in list(self._by_id.values()):
            req.aborted = True
        self._paused = False
        self._wake.set()
        if self._task is not None:
            while self._by_id and not self._task.done():
                await asyncio.sleep(0.01)
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._pool.shutdown(wait=True)

    @property
    def load(self) -> int:
        """Requests admitted or waiting."""
        return len(self._by_id)

    @property
    def paused(self) -> bool:
        return self._paused

    # -- requests ----------------------------------------------------------------------------------

    async def generate(self, token_ids: list[int], sampling: SamplingParams, *, request_id: str,
                       want_nucleus: bool = False, ignore_eos: bool = False) -> EngineOutput:
        """Queue one request and wait for it to finish (stop, length or abort)."""
        if request_id in self._by_id:
            raise EngineBadRequest(f"request_id {request_id!r} is already running", "request_id")
        if len(token_ids) >= self.max_model_len:
            raise EngineBadRequest(context_message(len(token_ids), self.max_model_len), "token_ids")
        # As in vLLM, a max_tokens beyond the context is not an error: generation stops ("length")
        # when the sequence reaches max_model_len.
        max_tokens = sampling.max_tokens
        seed = sampling.seed if sampling.seed is not None else self._rng.getrandbits(63)
        gen = torch.Generator().manual_seed(seed)
        row = RowParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                        num_logprobs=int(sampling.logprobs or 0), want_nucleus=want_nucleus, generator=gen)
        out = EngineOutput(request_id=request_id, prompt_len=len(token_ids),
                           nucleus_ids=[] if want_nucleus else None, nucleus_probs=[] if want_nucleus else None,
                           routing=[] if self.return_routed_experts else None)
        req = _Req(out=out, prompt=list(token_ids), max_tokens=max_tokens, stop_ids=set(sampling.stop_token_ids),
                   eos_ids=set() if ignore_eos else set(self.eos_ids), row=row,
                   future=asyncio.get_running_loop().create_future())
        self._by_id[request_id] = req
        self._waiting.append(req)
        self._wake.set()
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.aborted = True  # the HTTP client went away: stop spending compute on it
            self._wake.set()
            raise

    def abort(self, request_ids: list[str]) -> int:
        """Mark requests aborted; they finish at the next step boundary. Returns how many matched."""
        n = 0
        for rid in request_ids:
            req = self._by_id.get(rid)
            if req is not None:
                req.aborted = True
                n += 1
        self._wake.set()
        return n

    async def pause(self, mode: str = "keep") -> None:
        """Stop stepping. ``keep`` freezes requests, ``abort`` aborts them, ``wait`` lets them finish."""
        if mode == "abort":
            self.abort(list(self._by_id))
            while self._by_id:
                await asyncio.sleep(0.005)
        elif mode == "wait":
            self._draining = True
            self._wake.set()
            while self._rows:
                await asyncio.sleep(0.005)
            self._draining = False
        self._paused = True
        async with self._step_lock:  # returns once no step is in progress
            pass

    async def resume(self) -> None:
        if self.weights_damaged is not None:
            raise WeightUpdateRejected(f"the engine stays paused: {self.weights_damaged}; push a complete set of "
                                       "weights (update_weights) before resuming")
        self._paused = False
        self._wake.set()

    # -- weights -----------------------------------------------------------------------------------

    async def reload_weights(self, weights_path: str | Path) -> None:
        """Load a checkpoint directory in place, between steps (the version label is set separately)."""
        def load() -> None:
            load_checkpoint_into(self.model, Path(weights_path))
            self._after_weight_change()

        async with self._between_steps():
            await asyncio.get_running_loop().run_in_executor(self._pool, load)

    async def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: str | int) -> None:
        """Replace weights from an in-process state dict and label them ``version``, between steps."""
        def load() -> None:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            tied = {"lm_head.weight"} if getattr(self.config, "tie_word_embeddings", False) else set()
            if unexpected or set(missing) - tied:
                raise ValueError(f"state dict does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                                 f"unexpected {sorted(unexpected)[:5]}")
            self._after_weight_change()

        async with self._between_steps():
            await asyncio.get_running_loop().run_in_executor(self._pool, load)
            self.version = str(version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str | int) -> int:
        """Copy streamed ``(hf_name, tensor)`` pairs into the parameters in place and label them ``version``.

        The stream is consumed in the engine's worker thread, one tensor at a time (no second copy of the
        model is held). Every parameter must be covered; a name the model lacks or a wrong shape is refused
        before that tensor is copied. If the stream fails after some tensors were copied, the weights are a
        mix of two versions: the engine then stays paused (``weights_damaged``) until a complete update
        succeeds. Returns the bytes copied.
        """
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        unique = {id(p) for p in targets.values()}

        def copy() -> int:
            written: set[int] = set()
            copied = 0
            try:
                with torch.no_grad():
                    for name, tensor in named_tensors:
                        param = targets.get(name)
                        if param is None:
                            raise WeightUpdateRejected(f"weight {name!r} is not a parameter of {self.model_dir.name} "
                                                       f"(e.g. {next(iter(targets))!r})", parameter=name)
                        if tuple(tensor.shape) != tuple(param.shape):
                            raise WeightUpdateRejected(f"weight {name!r} has shape {tuple(tensor.shape)}, the model's "
                                                       f"is {tuple(param.shape)}", parameter=name)
                        param.copy_(tensor)
                        written.add(id(param))
                        copied += tensor.numel() * tensor.element_size()
                missing = [n for n, p in targets.items() if id(p) not in written]
                if missing:
                    raise WeightUpdateRejected(f"the update left {len(unique - written)} parameter(s) unwritten, "
                                               f"e.g. {missing[:3]}", parameter=missing[0])
            except BaseException as exc:
                if written:
                    self.weights_damaged = f"a weight update to version {version} failed after {len(written)} of " \
                                           f"{len(unique)} parameters were copied ({exc})"
                    self._paused = True
                raise
            self.weights_damaged = None
            self._after_weight_change()
            return copied

        async with self._between_steps():
            copied = await asyncio.get_running_loop().run_in_executor(self._pool, copy)
            self.version = str(version)
        return copied

    async def set_version(self, version: str) -> None:
        async with self._between_steps():
            self.version = str(version)

    @contextlib.asynccontextmanager
    async def _between_steps(self) -> AsyncIterator[None]:
        """Hold the step lock; a running decode burst is asked to end after its current step."""
        self._interrupt = True
        try:
            async with self._step_lock:
                self._interrupt = False
                yield
        finally:
            self._interrupt = False

    # -- scheduler ---------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        leaving: list[int] = []
        while True:
            if self._paused or not (self._rows or self._waiting or leaving):
                self._wake.clear()
                await self._wake.wait()
                continue
            # Requests aborted while waiting finish without running.
            for req in [r for r in self._waiting if r.aborted]:
                self._waiting.remove(req)
                self._finish(req, "abort")
            room = 0 if self._draining else self.max_batch - len(self._rows) + len(leaving)
            admit, self._waiting = self._waiting[:max(room, 0)], self._waiting[max(room, 0):]
            async with self._step_lock:
                if self._paused:  # paused while we were scheduling: put the admitted ones back
                    self._waiting = admit + self._waiting
                    continue
                try:
                    steps = await loop.run_in_executor(self._pool, self._step, leaving, admit, self.version)
                except Exception as exc:  # a failing forward fails its requests, not the server
                    log.exception("engine step failed")
                    for req in self._rows + admit:
                        if not req.future.done():
                            req.future.set_exception(exc)
                        self._by_id.pop(req.out.request_id, None)
                    self._rows, self._batch, self._lengths, leaving = [], BatchCache(self.config), [], []
                    continue
            self.steps += steps
            leaving = [i for i, req in enumerate(self._rows) if self._check_done(req)]
            await asyncio.sleep(0)  # let handlers run between steps

    def _done_reason(self, req: _Req) -> str | None:
        """Why ``req`` should finish now (``abort``, ``stop``, ``length``), or None. No side effects."""
        out = req.out
        if req.aborted:
            return "abort"
        if not out.token_ids:
            return None
        last = out.token_ids[-1]
        if last in req.stop_ids or last in req.eos_ids:
            return "stop"
        if len(out.token_ids) >= req.max_tokens or out.prompt_len + len(out.token_ids) >= self.max_model_len:
            return "length"
        return None

    def _check_done(self, req: _Req) -> bool:
        reason = self._done_reason(req)
        if reason is None:
            return False
        if reason == "stop" and req.out.token_ids[-1] in req.stop_ids:
            req.out.stop_reason = req.out.token_ids[-1]
        return self._finish(req, reason)

    def _finish(self, req: _Req, reason: str) -> bool:
        req.out.finish_reason = reason
        self._by_id.pop(req.out.request_id, None)
        if not req.future.done():
            req.future.set_result(req.out)
        return True

    # -- compute (worker thread) -------------------------------------------------------------------

    @torch.inference_mode()
    def _after_weight_change(self) -> None:
        """Forget every KV computed by the old weights: the prefix cache, and the running rows' batch cache
        (rows frozen by ``pause("keep")`` are prefilled again under the new weights)."""
        self.prefix_cache.clear()
        if self._static is not None:
            self._static.refresh_weights()
            for i, req in enumerate(self._rows):
                seq = req.prompt + req.out.token_ids[:-1]
                self._static.prefill(i, seq, 0)
                self._lengths[i] = len(seq)
            return
        if not self._rows:
            return
        self._batch = BatchCache(self.config)
        for req in self._rows:
            seq = req.prompt + req.out.token_ids[:-1]  # the last sampled id is the next decode input
            cache = new_cache(self.config)
            self._forward(torch.tensor([seq]), cache)
            self._batch.add(kv_of(cache), len(seq))

    def _keep_decoding(self) -> bool:
        """Whether the worker may run another decode step without returning to the scheduler: nothing
        for the scheduler to do (no arrivals, aborts, pause, weight change; no row finished)."""
        if self._waiting or self._paused or self._interrupt or not self._rows:
            return False
        return all(self._done_reason(r) is None for r in self._rows)

    @torch.inference_mode()
    def _step(self, leaving: list[int], admit: list[_Req], version: str) -> int:
        """One scheduling step; then, while nothing needs the scheduler, up to ``burst`` more decode steps
        (each scheduler round trip costs an executor hop and an event-loop turn). Returns steps run."""
        for i in leaving:
            req = self._rows[i]
            seq = req.prompt + req.out.token_ids[:-1]
            if self._static is not None:
                if self._lengths[i] == len(seq) and seq:
                    self.prefix_cache.put(seq, self._static.slot_kv(i, len(seq)))
            elif self._batch.lengths[i] == len(seq) and seq:
                self.prefix_cache.put(seq, self._batch.row_kv(i))
        if self._static is not None:
            keep = [i for i in range(len(self._rows)) if i not in set(leaving)]
            for new, old in enumerate(keep):  # compact: row j owns slot j (a source slot is never overwritten
                if new != old:                # before it is read: keep is ascending and new <= old)
                    self._static.move(old, new, self._lengths[old])
            self._lengths = [self._lengths[i] for i in keep]
        else:
            self._batch.remove(leaving)
        self._rows = [r for i, r in enumerate(self._rows) if i not in set(leaving)]
        if self._rows:
            self._decode(version)
        if self._static is not None:
            self._admit_static(admit, version)
        else:
            for req in admit:
                self._prefill(req, version)
                self._rows.append(req)
        steps = 1
        while steps < self.burst and self._keep_decoding():
            if self._may_look_ahead():
                steps += self._decode_ahead(version, self.burst - steps)
            else:
                self._decode(version)
                steps += 1
        return steps

    def _may_look_ahead(self) -> bool:
        return (self.lookahead and self.graph_sampling and self._static is not None
                and all(is_plain(r.row) for r in self._rows))

    def _decode_ahead(self, version: str, budget: int) -> int:
        """Up to ``budget`` decode steps with the draw in the graph, each queued before the previous one is read
        (``StaticDecoder.launch_draw``). A look-ahead step is queued only while every row is still running and
        its positions fit the cache; a row that finished on the step before takes no draw from it (it then
        holds one uniform number fewer in its discarded generator and one KV position past its length, never
        read). Returns the steps whose draws were read."""
        assert self._static is not None
        rows = [r.row for r in self._rows]
        pending: Any = self._static.launch_draw([r.out.token_ids[-1] for r in self._rows], self._lengths, rows)
        ahead = [n + 1 for n in self._lengths]  # the queued step's positions + 1: the next step's positions
        steps = 0
        while pending is not None:
            queued = None
            if (steps + 1 < budget and max(ahead) < self.max_model_len and not self._waiting and not self._paused
                    and not self._interrupt and all(self._done_reason(r) is None for r in self._rows)):
                queued = self._static.launch_draw(None, ahead, rows)
                ahead = [n + 1 for n in ahead]
            draws = pending()
            steps += 1
            for i, (req, draw) in enumerate(zip(self._rows, draws, strict=True)):
                if self._done_reason(req) is None:
                    req.out.record(draw, version)
                    self._lengths[i] += 1
            pending = queued
        return steps

    def _forward(self, ids: torch.Tensor, cache: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Last-position logits ``[B, V]`` and, when recording routing, experts ``[B*T, layers, k]``."""
        if self._routes is not None:
            self._routes.clear()
        # The trainer's recipe when compute_dtype differs from the weights (autocast on CPU too).
        cast = torch.autocast(self.device.type, dtype=self.compute_dtype) if self._autocast \
            else contextlib.nullcontext()
        with cast:
            out = self.model(input_ids=ids.to(self.device), use_cache=True, logits_to_keep=1,
                             **{self._cache_kw: cache}, **kw)
        routing = self._routes.take() if self._routes is not None else None
        return out.logits[:, -1].float(), routing  # [B, V] sampled on the device

    def _decode(self, version: str) -> None:
        if self._static is not None:
            last, rows = [r.out.token_ids[-1] for r in self._rows], [r.row for r in self._rows]
            if self.graph_sampling and all(is_plain(r) for r in rows):
                draws = self._static.decode_draw(last, self._lengths, rows)
            else:
                draws = sample_rows(self._static.decode(last, self._lengths), rows,  # [B, V] logits sampled eagerly
                                    self._log_softmax)
            self._lengths = [n + 1 for n in self._lengths]
            for req, draw in zip(self._rows, draws, strict=True):
                req.out.record(draw, version)
            return
        b = self._batch
        ids = torch.tensor([[r.out.token_ids[-1]] for r in self._rows])
        pos = torch.tensor([[n] for n in b.lengths], device=self.device)
        # Without padding no mask is needed: transformers then builds no 4D mask for the step.
        mask = b.attention_mask().to(self.device) if any(b.pads) else None
        logits, routing = self._forward(ids, b.cache, attention_mask=mask, position_ids=pos)
        b.lengths = [n + 1 for n in b.lengths]
        if routing is not None:
            for i, req in enumerate(self._rows):
                assert req.out.routing is not None
                req.out.routing.append(routing[i : i + 1])
        for req, draw in zip(self._rows, sample_rows(logits, [r.row for r in self._rows]), strict=True):
            req.out.record(draw, version)

    def _prefill(self, req: _Req, version: str) -> None:
        reused, kv = self.prefix_cache.lookup(req.prompt)
        cache = new_cache(self.config)
        if kv is not None:
            for layer, (k, v) in enumerate(kv):
                cache.update(k, v, layer)
        start = reused
        logits = None
        # Chunking bounds the attention-mask memory of a long suffix over a long cached prefix.
        chunk = len(req.prompt) if reused == 0 else self.prefill_chunk
        while start < len(req.prompt):
            piece = torch.tensor([req.prompt[start:start + chunk]])
            logits, routing = self._forward(piece, cache)
            if routing is not None and req.out.routing is not None:
                req.out.routing.append(routing)
            start += piece.shape[1]
        assert logits is not None
        self._batch.add(kv_of(cache), len(req.prompt))
        req.out.record(sample_rows(logits, [req.row])[0], version)


    def _admit_static(self, admit: list[_Req], version: str) -> None:
        """Prefill the admitted requests into the next free slots, in order. Consecutive ones with no cached
        prefix go as one batch of at most ``prefill_batch_tokens`` padded positions (one forward instead of
        one per request: a lone prefill is launch-bound like a decode step)."""
        assert self._static is not None
        group: list[_Req] = []

        def flush() -> None:
            if not group:
                return
            assert self._static is not None
            logits = self._static.prefill_rows(len(self._rows), [r.prompt for r in group])  # [n, V]
            for req, draw in zip(group, sample_rows(logits, [r.row for r in group], self._log_softmax), strict=True):
                req.out.record(draw, version)
                self._lengths.append(len(req.prompt))
                self._rows.append(req)
            group.clear()

        for req in admit:
            reused, kv = self.prefix_cache.lookup(req.prompt)
            longest = max([len(req.prompt)] + [len(r.prompt) for r in group])
            if kv is None and (len(group) + 1) * longest <= self.prefill_batch_tokens:
                group.append(req)
                continue
            flush()
            if kv is None and len(req.prompt) <= self.prefill_batch_tokens:
                group.append(req)
                continue
            self._prefill_static(req, version, reused, kv)
            self._rows.append(req)
        flush()

    def _prefill_static(self, req: _Req, version: str, reused: int,
                        kv: list[tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Prefill into the next free slot (the row's index once appended) after a cached prefix ``kv`` of
        ``reused`` positions (none: from position 0, in chunks of ``prefill_chunk``)."""
        assert self._static is not None
        slot = len(self._rows)
        if kv is not None:
            self._static.load_kv(slot, kv)
        start = reused
        chunk = len(req.prompt) if reused == 0 else self.prefill_chunk
        logits = None
        while start < len(req.prompt):
            piece = req.prompt[start:start + chunk]
            logits = self._static.prefill(slot, piece, start)  # [1, V]
            start += len(piece)
        assert logits is not None
        self._lengths.append(len(req.prompt))
        req.out.record(sample_rows(logits, [req.row], self._log_softmax)[0], version)
