"""SupConLoss against a hand-written loop and hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.training.losses import SupConLoss


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


def test_masked_kl_hand_computed():
    import math

    from agrame.training.losses import masked_kl

    t = torch.tensor([[0.0, math.log(3.0), 5.0]])      # softmax over the first two: [1/4, 3/4]
    s = torch.tensor([[0.0, 0.0, -2.0]])               # [1/2, 1/2]
    mask = torch.tensor([[True, True, False]])
    expected = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert float(masked_kl(t, s, mask)) == pytest.approx(expected, abs=1e-6)
    assert float(masked_kl(t, t, mask)) == pytest.approx(0.0, abs=1e-7)
    assert float(masked_kl(t, s, torch.zeros_like(mask))) == 0.0


def test_multigranular_loss_hand_computed_and_weightings():
    import math

    from agrame.training.losses import MultiGranularKLLoss, masked_kl

    tp = torch.tensor([[2.0, 0.0]])                    # teacher passage logits
    sp = torch.tensor([[0.0, 0.0]])
    ts = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])      # passage 0: two sentences; passage 1: one
    ss = torch.tensor([[[0.0, 1.0], [3.0, 0.0]]])
    mask = torch.tensor([[[True, True], [True, False]]])
    p = [math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)]
    l_psg = p[0] * math.log(p[0] / 0.5) + p[1] * math.log(p[1] / 0.5)
    a = [math.e / (math.e + 1), 1 / (math.e + 1)]     # teacher sentences of passage 0
    l_s0 = a[0] * math.log(a[0] / a[1]) + a[1] * math.log(a[1] / a[0])  # student is the mirror image
    l_s1 = 0.0                                          # one sentence: both distributions are [1]
    out = MultiGranularKLLoss("softmax")(tp, sp, ts, ss, mask)
    assert float(out["passage"]) == pytest.approx(l_psg, abs=1e-6)
    assert float(out["sentence"]) == pytest.approx(p[0] * l_s0 + p[1] * l_s1, abs=1e-6)
    assert float(out["loss"]) == pytest.approx(l_psg + p[0] * l_s0, abs=1e-6)
    sig = MultiGranularKLLoss("sigmoid")(tp, sp, ts, ss, mask)
    assert float(sig["sentence"]) == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item() * l_s0, abs=1e-6)
    only = MultiGranularKLLoss(sentence_weight=0.0)(tp, sp, ts, ss, mask)
    assert float(only["loss"]) == pytest.approx(l_psg, abs=1e-6)
    # Gradients reach the student only.
    sp2 = sp.clone().requires_grad_(True)
    ss2 = ss.clone().requires_grad_(True)
    MultiGranularKLLoss()(tp, sp2, ts, ss2, mask)["loss"].backward()
    assert sp2.grad is not None and ss2.grad[0, 1, 1] == 0.0  # padding gets no gradient
    assert masked_kl(ts[0], ss[0], mask[0]).shape == (2,)
