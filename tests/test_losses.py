"""SupConLoss against a hand-written loop and hand-computed values."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.losses import SupConLoss


def naive_supcon(z, labels, t):
    n = len(labels)
    losses = []
    for i in range(n):
        pos = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not pos:
            continue
        denom = sum(math.exp(float(z[i] @ z[a]) / t) for a in range(n) if a != i)
        losses.append(-sum(math.log(math.exp(float(z[i] @ z[p]) / t) / denom) for p in pos) / len(pos))
    return sum(losses) / len(losses) if losses else 0.0


@given(st.lists(st.integers(0, 3), min_size=2, max_size=8), st.integers(0, 10_000), st.sampled_from([0.5, 1.0, 0.1]))
@settings(max_examples=100, deadline=None)
def test_supcon_matches_loop(labels, seed, t):
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(len(labels), 5, generator=g, dtype=torch.float64), dim=-1)
    got = float(SupConLoss(t)(z, torch.tensor(labels)))
    assert math.isclose(got, naive_supcon(z, labels, t), rel_tol=1e-9, abs_tol=1e-9)


def test_supcon_hand_computed():
    # Two positives at cos 1, one negative at cos 0, t = 1: -log(e / (e + 1)) for both anchors.
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    expected = -math.log(math.e / (math.e + 1))
    assert math.isclose(float(SupConLoss(1.0)(z, torch.tensor([0, 0, 1]))), expected, rel_tol=1e-6)
    assert float(SupConLoss(1.0)(z, torch.tensor([0, 1, 2]))) == 0.0  # no positives: no loss
