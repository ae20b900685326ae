"""Losses, each an ``nn.Module``."""

from __future__ import annotations

import torch
from torch import nn


class SupConLoss(nn.Module):
    """Supervised contrastive loss (Khosla et al. 2020, Eq. 2, "L_out"), as the Sub-Sentence
    Encoder uses it: items with the same label are positives of each other, every other
    item in the batch is a negative.

    ``embeddings``: ``[N, d]`` unit vectors; ``labels``: ``[N]``. Items without any positive
    contribute nothing. ``temperature`` 0.01 is the sub-sentence encoder paper's value.
    """

    def __init__(self, temperature: float = 0.01):
        super().__init__()
        self.temperature = temperature

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = embeddings.shape[0]
        logits = embeddings @ embeddings.T / self.temperature
        self_mask = torch.eye(n, dtype=torch.bool, device=embeddings.device)
        # The anchor itself is excluded from the denominator: fill with -inf, not 0.
        logits = logits.masked_fill(self_mask, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        positives = (labels.unsqueeze(0) == labels.unsqueeze(1)) & ~self_mask
        counts = positives.sum(dim=1)
        has_pos = counts > 0
        if not has_pos.any():
            return embeddings.sum() * 0.0
        pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(dim=1)
        return -(pos_log_prob[has_pos] / counts[has_pos]).mean()
