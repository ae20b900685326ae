"""Weight-space interpolation between the untrained and a fine-tuned model (WiSE-FT).

    python -m training.interpolate --start runs/zero-shot-128 --tuned runs/students/big/final \\
        --mix 0.5 --out runs/students/big-wise-0.5

θ(λ) = (1 − λ)·θ₀ + λ·θ₁ for every backbone tensor, the projection and the query-marker
embedding rows (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models": the
interpolated model keeps the zero-shot model's robustness out of domain while keeping most
of the fine-tuned gain in domain). θ₀ must be the model training started from — same
backbone, and the *same projection* (a student started with ``--init-model`` of a projected
zero-shot model) — or the average of two unrelated projections means nothing; that is
checked. Settings (markers, α) are the tuned model's; choose λ (and then α) on held-out
*train* data: ``python -m training.choose_mix``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from agrame.encoder import Encoder, ModelError
from agrame.loading import load_encoder


def interpolate(start: Encoder, tuned: Encoder, mix: float) -> Encoder:
    """A new encoder with weights (1 − mix)·start + mix·tuned and the tuned model's settings."""
    if not 0.0 <= mix <= 1.0:
        raise ValueError("mix must be in [0, 1]")
    a, b = start.backbone.state_dict(), tuned.backbone.state_dict()
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise ModelError("the two models have different backbones")
    if (start.projection is None) != (tuned.projection is None) or (
            start.projection is not None and start.projection.weight.shape != tuned.projection.weight.shape):
        raise ModelError("the two models need projections of the same shape (start training from --init-model)")
    import copy

    out = copy.deepcopy(tuned)
    mixed = {k: (torch.lerp(a[k].float(), b[k].float(), mix).to(b[k].dtype) if b[k].is_floating_point() else b[k])
             for k in b}
    out.backbone.load_state_dict(mixed)
    if out.projection is not None:
        with torch.no_grad():
            out.projection.weight.copy_(torch.lerp(start.projection.weight, tuned.projection.weight, mix))
    out.source = f"{tuned.source} (WiSE-FT λ={mix:g} from {start.source})"
    return out


def projection_agreement(start: Encoder, tuned: Encoder) -> float:
    """Mean cosine between matching projection rows: near 1 when training started from ``start``'s projection."""
    if start.projection is None and tuned.projection is None:
        return 1.0
    if start.projection is None or tuned.projection is None or start.projection.weight.shape != tuned.projection.weight.shape:
        return 0.0
    with torch.no_grad():
        return float(nn.functional.cosine_similarity(start.projection.weight, tuned.projection.weight, dim=1).mean())


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="θ₀: the model training started from")
    parser.add_argument("--tuned", required=True, help="θ₁: the fine-tuned model")
    parser.add_argument("--mix", type=float, required=True, help="λ ∈ [0, 1]; 0 = start, 1 = tuned")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        start, tuned = load_encoder(args.start), load_encoder(args.tuned)
    except ModelError as exc:
        raise SystemExit(f"error: {exc}")
    agreement = projection_agreement(start, tuned)
    if agreement < 0.5:
        raise SystemExit(f"error: the projections disagree (mean row cosine {agreement:.2f}): "
                         "was the tuned model trained from --start (training.student --init-model)?")
    interpolate(start, tuned, args.mix).save(Path(args.out))
    print(f"wrote {args.out}: λ={args.mix:g}, projection row cosine {agreement:.3f}")


if __name__ == "__main__":
    main()
