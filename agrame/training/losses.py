"""Losses, each an ``nn.Module``."""

from __future__ import annotations

from typing import Optional

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


def masked_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) ‖ softmax(student)) over the True entries of each row: ``[..., n] → [...]``.

    Entries outside ``mask`` (padding sentences) get probability 0 on both sides (−inf
    before the softmax, and 0·log 0 = 0). A row with no entry gives 0.
    """
    neg = torch.finfo(student_logits.dtype).min
    t = torch.log_softmax(teacher_logits.masked_fill(~mask, neg), dim=-1)
    s = torch.log_softmax(student_logits.masked_fill(~mask, neg), dim=-1)
    terms = torch.where(mask, t.exp() * (t - s), torch.zeros_like(s))
    return terms.sum(dim=-1)


class PassageKLLoss(nn.Module):
    """L_psg = KL(softmax CE(q, [p]) ‖ softmax S(q, [p])) over the k+1 passages (AGRaME §3.3), batch mean.

    ``teacher``, ``student``: ``[B, P]``.
    """

    def forward(self, teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
        return masked_kl(teacher, student, torch.ones_like(student, dtype=torch.bool)).mean()


class MultiGranularKLLoss(nn.Module):
    """L = L_psg + L_sent, L_sent = Σ_i w_i · KL(softmax CE'(q, [s of p_i]) ‖ softmax S'(q, [s of p_i])).

    Shapes: passage scores ``[B, P]``; sentence scores ``[B, P, S]`` with ``sentence_mask``
    ``[B, P, S]`` (False for padding). ``weighting``: ``"softmax"`` — w = softmax of the
    teacher passage scores over the k+1 passages (sums to 1); ``"sigmoid"`` — w_i =
    σ(CE(q, p_i)) (the paper's text; the two versions of the paper differ, both are here).
    Weights are teacher quantities: no gradient flows through them. ``sentence_weight``
    scales L_sent (1 in the paper); 0 gives the passage-loss-only ColBERT baseline.
    """

    def __init__(self, weighting: str = "softmax", sentence_weight: float = 1.0):
        super().__init__()
        if weighting not in ("softmax", "sigmoid"):
            raise ValueError(f"weighting must be 'softmax' or 'sigmoid', not {weighting!r}")
        self.weighting, self.sentence_weight = weighting, sentence_weight
        self.passage = PassageKLLoss()

    def weights(self, teacher_passage: torch.Tensor) -> torch.Tensor:
        if self.weighting == "softmax":
            return torch.softmax(teacher_passage, dim=-1)
        return torch.sigmoid(teacher_passage)

    def forward(self, teacher_passage: torch.Tensor, student_passage: torch.Tensor,
                teacher_sentence: torch.Tensor, student_sentence: torch.Tensor,
                sentence_mask: torch.Tensor, own_passages: Optional[int] = None,
                labelled: Optional[torch.Tensor] = None) -> dict:
        """``own_passages``: with in-batch negatives the passage scores are ``[B, B·P]`` (query b's
        own P passages at columns b·P … b·P+P−1); the sentence weights use the own ones only.
        ``labelled`` ``[B]`` (bool): the queries whose sentences are labelled; L_sent is their mean (a user's
        pairs may label some and not others: an unlabelled one would teach a uniform sentence distribution)."""
        l_psg = self.passage(teacher_passage, student_passage)
        per_passage = masked_kl(teacher_sentence, student_sentence, sentence_mask.bool())  # [B, P]
        own = teacher_passage
        if own_passages is not None and teacher_passage.shape[-1] != own_passages:
            device = teacher_passage.device  # (a gather index on another device fails on a GPU)
            b = torch.arange(teacher_passage.shape[0], device=device).unsqueeze(1)
            own = teacher_passage.gather(1, b * own_passages + torch.arange(own_passages, device=device))
        w = self.weights(own).detach()
        per_query = (w * per_passage).sum(dim=-1)
        if labelled is None:
            l_sent = per_query.mean()
        else:
            keep = labelled.to(per_query.device, per_query.dtype)
            l_sent = (per_query * keep).sum() / keep.sum().clamp(min=1.0)
        total = l_psg + self.sentence_weight * l_sent
        return {"loss": total, "passage": l_psg.detach(), "sentence": l_sent.detach()}
