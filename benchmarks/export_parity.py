"""Export parity: the shipped models exported to the Stanford ColBERT and PyLate formats, encoded
by the real colbert-ai 0.2.22 and PyLate, against AGRaME's own vectors.

    python -m benchmarks.export_parity [--passages 200 --queries 100]

For each model: pooled-corpus passages (seed 0) and SQuAD dev / nq-oracle questions (half each).
Passages: those AGRaME encodes in one window (within ``doc_maxlen``) must get the same number of
vectors, and each vector's cosine with AGRaME's is recorded (min / mean over all tokens).
Queries: the rows AGRaME scores (its query, no [MASK] padding for the shipped models) against
the same tokens' rows of the library's query matrix; a model without a [Q] marker gets one there
(its row is skipped, the others compared), so its query vectors differ by design
(``agrame.export.compatibility``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from agrame.loading import load_encoder
from agrame.export import compatibility, export

from .common import command_line, sample, write_result
from .data import load_pool, mixed_questions

MODELS = ("gpu2100-agrame128", "zero-shot", "zero-shot-128", "squad-a1")  # the default first


def _colbert_order(vectors: torch.Tensor, prefix: int) -> torch.Tensor:
    return torch.cat([vectors[:prefix], vectors[prefix + 1:], vectors[prefix:prefix + 1]])


def _stats(cosines, same_counts, n) -> dict:
    c = np.concatenate(cosines) if cosines else np.zeros(0)
    return {"texts": n, "same_token_count": f"{same_counts}/{n}",
            "cosine_min": round(float(c.min()), 5) if len(c) else None,
            "cosine_mean": round(float(c.mean()), 5) if len(c) else None}


def measure(name: str, texts, queries, work: Path) -> dict:
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint
    from pylate import models

    encoder = load_encoder(name)
    width = encoder._window_width()
    ids = encoder.tokenizer(texts, add_special_tokens=False)["input_ids"]
    single = [t for t, i in zip(texts, ids) if len(i) <= width]
    ours = encoder.encode_passages(single)
    prefix = 1 + (encoder.marker_id("D") is not None)
    ours_q = [encoder.encode_query(q, "Q").vectors for q in queries]
    row = {"model": encoder.source, "dim": encoder.dim, "differences": compatibility(encoder),
           "passages_within_doc_maxlen": f"{len(single)}/{len(texts)}"}
    st = export(encoder, work / f"{name}-stanford", "stanford")
    checkpoint = Checkpoint(str(st), colbert_config=ColBERTConfig())
    flat, lengths = checkpoint.docFromText(single, bsize=32, keep_dims="flatten")
    theirs_q = checkpoint.queryFromText(queries, bsize=32)
    pl = export(encoder, work / f"{name}-pylate", "pylate")
    model = models.ColBERT(model_name_or_path=str(pl), device="cpu")
    for fmt, docs, qs in (("stanford", torch.split(flat.float(), lengths), [q.float() for q in theirs_q]),
                          ("pylate", [torch.from_numpy(d) for d in model.encode(single, is_query=False, batch_size=32)],
                           [torch.from_numpy(q) for q in model.encode(queries, is_query=True, batch_size=32)])):
        cos, same = [], 0
        for d, o in zip(docs, ours):
            o = _colbert_order(o.vectors, prefix)
            if d.shape == o.shape:
                same += 1
                cos.append((d * o).sum(-1).numpy())
        qcos, qsame = [], 0
        for d, o in zip(qs, ours_q):
            if encoder.marker_id("Q") is None:  # the inserted [Q] row has no AGRaME counterpart: align the rest
                d = torch.cat([d[:1], d[2:]])
            n = min(len(d), len(o))
            qsame += len(o) <= len(d)
            qcos.append((d[:n] * o[:n]).sum(-1).numpy())
        row[fmt] = {"passages": _stats(cos, same, len(single)), "queries": _stats(qcos, qsame, len(queries))}
    return row


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.export_parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    pool = load_pool()
    texts = sample(list(pool.texts), args.passages, args.seed)
    queries = mixed_questions(pool, args.queries, args.seed)
    work = Path(tempfile.mkdtemp(prefix="export-parity-"))
    try:
        rows = {name: measure(name, texts, queries, work) for name in args.models}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import colbert
    import pylate

    result = {"benchmark": "export_parity", "what": "exported checkpoints in colbert-ai and PyLate vs AGRaME",
              "libraries": {"colbert-ai": getattr(colbert, "__version__", "0.2.22"), "pylate": pylate.__version__},
              "passages": f"{len(texts)} pooled-corpus passages (seed {args.seed})",
              "queries": f"{len(queries)} questions, squad-dev and nq-oracle half each (seed {args.seed})",
              "models": rows}
    out = write_result("export_parity", result, args.out, command_line("benchmarks.export_parity", argv))
    print(json.dumps(result, indent=1), "→", out)


if __name__ == "__main__":
    main()
