"""How a training process computes on its device (issue 61): bfloat16 autocast and TF32 matmuls on a GPU.

The first GPU student trained in float32 with neither (0.45 s a step at 64 questions, 55 GB). On CUDA the
default (``auto``) is bfloat16 autocast over the backbone and projection (:attr:`agrame.encoder.Encoder.compute_dtype`)
with float32 master weights, and TF32 for the float32 matmuls left (MaxSim, the mining scan): the token
vectors leave the encoder in float32, so scores, sums and losses are float32 as before. Elsewhere (``auto``
on the CPU) nothing changes; ``fp32`` on CUDA turns both off (an exact reference).
"""

from __future__ import annotations

from typing import Optional

import torch

CHOICES = ("auto", "bf16", "fp32")


def resolve(device: str, precision: str = "auto") -> str:
    """``bf16`` or ``fp32`` for ``device``: ``auto`` is bf16 on CUDA and fp32 elsewhere."""
    if precision not in CHOICES:
        raise ValueError(f"precision must be one of {', '.join(CHOICES)}, not {precision!r}")
    if precision == "auto":
        return "bf16" if str(device).startswith("cuda") else "fp32"
    return precision


def apply(encoder, device: str, precision: str = "auto") -> str:
    """Set ``encoder``'s compute dtype (and TF32 on CUDA) for ``precision``; returns what was chosen."""
    chosen = resolve(device, precision)
    encoder.compute_dtype = torch.bfloat16 if chosen == "bf16" else None
    if str(device).startswith("cuda"):
        tf32 = chosen == "bf16"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return chosen


def limit_memory(device: str, fraction: Optional[float]) -> None:
    """Cap this process's share of its GPU (students side by side: one may not starve the other; the caching
    allocator frees its cache and retries before it fails at the cap)."""
    if fraction and str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(fraction, cuda_index(device))


def cuda_index(device: str) -> int:
    """The GPU index ``device`` names (plain ``cuda``: the current one). The memory cap wants an index:
    ``torch.device("cuda")`` has none, which the first call with the cap stopped at (2026-11-27, H200)."""
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index
