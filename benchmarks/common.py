"""Shared benchmark plumbing: where the data lives, loading, result files."""

from __future__ import annotations

import json
import os
import platform
import random
import shlex
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from agrame.datasets import DataError, data_path, sample, sentence_of, squad_paragraphs  # noqa: F401 (re-exported)
from agrame.datasets import data_dir as _data_dir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def data_dir() -> Path:
    """:func:`agrame.datasets.data_dir`, or exit with its message (a benchmark's command line)."""
    try:
        return _data_dir()
    except DataError as exc:
        sys.exit(f"error: {exc}")


def machine() -> dict:
    import torch
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__}


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process in MB: its address space's high-water mark (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across fork and exec, so a child started by
    a process that had grown large (the scale benchmark's build, then its search) would report the
    parent's peak as its own.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    if pid != "self":
        return float("nan")  # another process's peak is only known through /proc
    import resource  # not Linux: the best there is (kB on Linux, bytes on macOS; only Linux runs this)

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def add_model_args(parser, alpha_help: str = "α in S'(q,s) + α·S(q,p) (default: the model's)",
                   alpha_default=None) -> None:
    """Options every ranking benchmark shares: sample, models, output file."""
    parser.add_argument("--limit", type=int, default=None, help="questions sampled (fixed seed); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="multi-vector model folder or shipped name (default: the package default, gpu2100-agrame128)")
    parser.add_argument("--alpha", type=float, default=alpha_default, help=alpha_help)
    parser.add_argument("--baseline-model", default=None,
                        help="Hugging Face folder for the single-vector/SubEncoder baselines (default: MiniLM)")
    parser.add_argument("--span-query-marker", choices=("Q", "Q'"), default=None,
                        help="marker of the sub-unit query, overriding the model's (ablation A2)")
    parser.add_argument("--tag", default=None,
                        help="label of this run (e.g. a trained model's name): kept in the result and its file name")
    parser.add_argument("--out", default=None, help="result file (default: benchmarks/results/<name>.json)")


def tagged(name: str, tag: Optional[str]) -> str:
    """A result file's name: the benchmark's, then the run's tag."""
    return f"{name}-{tag}" if tag else name


def command_line(module: str, argv: Optional[Sequence[str]]) -> str:
    """The command that reproduces a run: ``python -m <module> <the arguments parsed>``."""
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", "-m", module, *args])


def write_result(name: str, result: dict, out: Optional[str], command: str) -> Path:
    """Write ``result`` with its command and machine to ``benchmarks/results/<name>.json`` (atomically)."""
    result = {**result, "command": command, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def tiny_encoder(doc_maxlen: int = 24, query_maxlen: int = 8, dim: Optional[int] = 16, seed: int = 0):
    """A tiny randomly initialised BERT that encodes in milliseconds (the tests' model, and the
    standing safety suite's: what it checks is the store, not the ranking)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from agrame.encoder import Encoder, EncoderSettings
    from agrame.backbones import default_model_path

    torch.manual_seed(seed)
    # The real MiniLM vocabulary keeps tokenisation (unicode, word pieces, offsets) realistic.
    tokenizer = BertTokenizerFast(vocab_file=str(default_model_path() / "vocab.txt"), do_lower_case=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    backbone = BertModel(config, add_pooling_layer=False)
    projection = torch.nn.Linear(32, dim, bias=False) if dim else None
    settings = EncoderSettings(dim=dim, doc_maxlen=doc_maxlen, doc_overlap=6, query_maxlen=query_maxlen)
    return Encoder(backbone, tokenizer, settings, projection, source="tiny-test-bert")
