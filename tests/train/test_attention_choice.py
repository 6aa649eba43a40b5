"""Which attention the torch trainer takes for a compute dtype (issue 31): varlen (flash) only for bf16/fp16 on
CUDA; ``auto`` falls back to SDPA for fp32, an explicit ``varlen`` with fp32 is a ConfigError. The reasons are
pure functions of the model config, device and dtype, so they are checked here on the CPU; the GPU side
(fp32 training and scoring on CUDA) is ``test_fp32_gpu.py``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lego_rl.errors import ConfigError
from lego_rl.serving.tiny_model import ensure_tiny_model
from lego_rl.train import varlen_attention
from lego_rl.train.torch_backend import TorchBackend, TorchTrainSettings


def model(**config: object) -> SimpleNamespace:
    """A stand-in with what ``unsupported_reason`` reads: ``config`` and ``set_attn_implementation``."""
    return SimpleNamespace(config=SimpleNamespace(**config), set_attn_implementation=lambda name: None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_take_the_kernel(dtype: torch.dtype) -> None:
    assert varlen_attention.dtype_reason(dtype) is None


def test_fp32_is_refused_with_the_reason() -> None:
    reason = varlen_attention.dtype_reason(torch.float32)
    assert reason is not None and "float32" in reason and "bf16 or fp16" in reason
    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    if varlen_attention._kernel() is not None:  # torch >= 2.10: the dtype is the only thing missing
        assert varlen_attention.unsupported_reason(model(layer_types=["full_attention"]), cuda) is None
    assert varlen_attention.unsupported_reason(model(), cuda, torch.float32) == reason
    assert "not CUDA" in (varlen_attention.unsupported_reason(model(), torch.device("cpu"), torch.bfloat16) or "")


def test_settings_refuse_varlen_with_fp32_and_accept_the_rest() -> None:
    with pytest.raises(ConfigError, match="packed_attention 'varlen' cannot run with precision 'fp32'") as exc:
        TorchTrainSettings(lr=1e-4, packed_attention="varlen", precision="fp32")
    assert exc.value.parameter == "packed_attention"
    for attention in ("auto", "sdpa"):
        assert TorchTrainSettings(lr=1e-4, packed_attention=attention, precision="fp32").precision == "fp32"
    assert TorchTrainSettings(lr=1e-4, packed_attention="varlen").precision == "bf16"


def test_cpu_computes_in_fp32_and_auto_keeps_sdpa() -> None:
    tiny: Path = ensure_tiny_model()
    for precision in ("bf16", "fp32"):
        b = TorchBackend(tiny, TorchTrainSettings(lr=1e-4, device="cpu", precision=precision))  # type: ignore[arg-type]
        assert b.compute_dtype == torch.float32 and b._varlen is False
