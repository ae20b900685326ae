"""Store a model as a delta over its base, MiniLM or e5 (agrame.delta), where the package can load it.

    python -m training.export --model runs/students/agrame/final --out runs/export/agrame
    python -m training.export --model … --out agrame/models/NAME      # shipped, --model NAME
    python -m training.export --model … --out agrame/models/default   # the package default

The default is zero-shot MiniLM until a trained model beats it across the benchmark suite
(issue 13): export to ``agrame/models/default`` only a model that does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from agrame.delta import BASE_E5, BASE_MINILM, DELTA_FILE, export_delta
from agrame.loading import load_encoder

LIMIT_MB = 16.0


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="trained AGRaME checkpoint folder")
    parser.add_argument("--out", required=True, help="delta folder to write (agrame/models/NAME ships it by name)")
    args = parser.parse_args(argv)
    encoder = load_encoder(args.model)
    # e5's backbone keeps the XLM-RoBERTa tokenizer class in its config (agrame.e5.bert_config).
    e5 = getattr(encoder.backbone.config, "tokenizer_class", None) == "XLMRobertaTokenizer"
    meta = export_delta(encoder, args.out, base=BASE_E5 if e5 else BASE_MINILM)
    size = (Path(args.out) / DELTA_FILE).stat().st_size / 2**20
    if size > LIMIT_MB:
        raise SystemExit(f"error: the delta is {size:.1f} MB, above the {LIMIT_MB} MB the repository allows")
    print(f"wrote {args.out}: {len(meta['tensors'])} tensors, {size:.1f} MB, fingerprint {meta['fingerprint'][:12]}")


if __name__ == "__main__":
    main()
