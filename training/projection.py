"""Untrained MiniLM with a fixed 128-d projection: the zero-shot model at the index's size.

    python -m training.projection --out runs/zero-shot-128 [--dim 128 --passages 1024 --seed 0]
    python -m training.projection --out runs/e5-small-128 --base e5-small   # multilingual-e5-small
    python -m training.projection --out runs/a1-init --like-student runs/train/squad-train.jsonl

(the second: the projection ``training.student`` starts from without ``--init-model`` — the
gold passages of the data's first 128 records —, i.e. θ₀ of squad-a1 for interpolation.)

Zero-shot MiniLM gives 384-d token vectors; a compressed index then stores 96 bytes of
2-bit residuals per token instead of 32. A *random* projection ruins ranking, but the top
right singular vectors of MiniLM's own token vectors keep nearly all of their dot products
(MaxSim's quantity), so this model needs no training: the projection comes from the token
vectors of ``--passages`` random SQuAD *train* paragraphs (never a benchmark split). It
keeps the zero-shot query settings (no markers, no [MASK] padding, α 0.5) and is also the
starting point θ₀ of training and of weight-space interpolation (``training.interpolate``).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Optional, Sequence

from torch import nn

from agrame.encoder import Encoder
from agrame.backbones import E5_SMALL, ZERO_SHOT, e5_zero_shot_settings, zero_shot_settings
from agrame.loading import load_encoder

BASES = {ZERO_SHOT: zero_shot_settings, E5_SMALL: e5_zero_shot_settings}


def _projected(texts: Sequence[str], dim: int, base_name: str = ZERO_SHOT) -> Encoder:
    """A zero-shot backbone (MiniLM, or e5) with its query settings and the projection onto the top
    ``dim`` (uncentred) singular directions of the token vectors of ``texts``."""
    from agrame.training.student import init_projection

    base = load_encoder(base_name)
    settings = BASES[base_name]()
    settings.dim = dim
    encoder = Encoder(base.backbone, base.tokenizer, settings, nn.Linear(base.dim, dim, bias=False),
                      source="zero-shot-projected")
    init_projection(encoder, texts)
    return encoder


def projected_zero_shot(dim: int = 128, passages: int = 1024, seed: int = 0, base: str = ZERO_SHOT) -> Encoder:
    """A zero-shot model with its ``dim`` principal token directions from random SQuAD train paragraphs."""
    from agrame.datasets import squad_paragraphs

    texts = [p["context"] for p in squad_paragraphs("train")]
    return _projected(random.Random(seed).sample(texts, min(passages, len(texts))), dim, base)


def student_start(data: str, dim: int = 128) -> Encoder:
    """Zero-shot MiniLM with the projection ``training.student`` initialises from ``data``."""
    from .data import read

    return _projected([e["passages"][0]["text"] for e in read(data)[:128]], dim)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--passages", type=int, default=1024, help="SQuAD train paragraphs for the SVD")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", choices=sorted(BASES), default=ZERO_SHOT,
                        help="backbone: zero-shot MiniLM (default) or multilingual-e5-small")
    parser.add_argument("--like-student", default=None, metavar="DATA",
                        help="the projection training.student starts from with this --data (no --init-model)")
    args = parser.parse_args(argv)
    if args.like_student:
        student_start(args.like_student, args.dim).save(Path(args.out))
        print(f"wrote {args.out}: zero-shot MiniLM with the student's starting projection from {args.like_student}")
        return
    encoder = projected_zero_shot(args.dim, args.passages, args.seed, args.base)
    encoder.save(Path(args.out))
    print(f"wrote {args.out}: {args.base}, {args.dim}-d projection from {args.passages} SQuAD train paragraphs")


if __name__ == "__main__":
    main()
