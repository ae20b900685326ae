"""Export an AGRaME model as a Stanford ColBERT (colbert-ai) or a PyLate checkpoint folder.

Both formats encode a passage as ``[CLS] [D] tokens [SEP]`` (truncated at ``doc_maxlen``) and a
query as ``[CLS] [Q] tokens [SEP]`` padded with ``[MASK]`` to ``query_maxlen``, through the backbone
and a bias-free linear layer, unit-normalised; punctuation vectors are dropped from passages. An
AGRaME model maps onto that exactly where its settings do:

* the projection becomes ``linear.weight`` (a model without one gets the identity, so its
  vectors keep their width);
* the ``[D]`` marker is the document token; a model without one cannot be exported (both formats
  always insert it);
* queries: both formats always insert ``[Q]`` and pad with ``[MASK]``. Without a ``[Q]`` marker
  (the zero-shot models) the query gets one it never had: its vectors change. A model that does
  not pad queries (every shipped one) keeps its real-token vectors as long as the masks are not
  attended (``attend_to_mask_tokens`` false), but the mask vectors are scored too;
* the sub-unit marker ``[Q']``, α and windows over long passages have no counterpart (sentences
  are an AGRaME notion); e5's text prefixes neither — such a model is refused.

:func:`compatibility` lists these differences for a model; ``agrame export`` prints them. The
parity with the real libraries is measured by ``python -m benchmarks.export_parity``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Dict, List

import torch

from .encoder import Encoder, ModelError

FORMATS = ("stanford", "pylate")


def compatibility(encoder: Encoder) -> List[str]:
    """What the exported checkpoint will do differently from AGRaME (empty: nothing)."""
    s = encoder.settings
    notes = []
    if encoder.marker_id("Q") is None:
        notes.append("queries: the model has no [Q] marker, and colbert-ai / PyLate always insert one "
                     "([unused0]): query vectors differ")
    if not s.query_augmentation:
        notes.append("queries: the model does not pad queries with [MASK]; colbert-ai / PyLate do and score "
                     "the mask vectors" + (" (attended: real-token vectors change too)" if s.attend_to_mask_tokens
                                           else " (not attended: real-token vectors are unchanged)"))
    if s.span_query_marker == "Q'" and encoder.marker_id("Q'") is not None:
        notes.append("sentences: the sub-unit query marker [Q'] has no counterpart (use the [Q] encoding)")
    notes.append(f"passages longer than doc_maxlen ({s.doc_maxlen} tokens) are truncated, not windowed; queries "
                 f"longer than query_maxlen ({s.query_maxlen}) are truncated, not kept whole")
    return notes


def _check(encoder: Encoder) -> None:
    s = encoder.settings
    if s.query_prefix or s.passage_prefix:
        raise ModelError(f"{encoder.source}: its text prefixes ({s.query_prefix!r}, {s.passage_prefix!r}) have no "
                         "counterpart in colbert-ai or PyLate, which insert one marker token")
    if encoder.marker_id("D") is None:
        raise ModelError(f"{encoder.source}: no [D] marker; colbert-ai and PyLate always insert one")
    for name in ("Q", "D"):
        token = s.markers.get(name) or "[unused0]"
        if token not in encoder.tokenizer.get_vocab():
            raise ModelError(f"{encoder.source}: marker {token!r} is not in the vocabulary")


def _linear(encoder: Encoder) -> torch.Tensor:
    if encoder.projection is not None:
        return encoder.projection.weight.detach().float().contiguous()
    return torch.eye(encoder.dim, dtype=torch.float32)


def _fresh(out: Path) -> Path:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not empty")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _commit(tmp: Path, out: Path) -> Path:
    if out.exists():
        out.rmdir()  # empty, checked by _fresh
    tmp.replace(out)
    return out


def _markers(encoder: Encoder) -> Dict[str, str]:
    return {"Q": encoder.settings.markers.get("Q") or "[unused0]", "D": encoder.settings.markers["D"]}


def export_stanford(encoder: Encoder, out: str | Path) -> Path:
    """A folder colbert-ai 0.2.22 loads with ``Checkpoint(out, ColBERTConfig())``: ``config.json``
    (architecture ``HF_ColBERT``), ``model.safetensors`` (``bert.*`` and ``linear.weight``), the
    tokenizer and ``artifact.metadata`` (its ColBERTConfig)."""
    from safetensors.torch import save_file

    _check(encoder)
    out = Path(out)
    tmp = _fresh(out)
    try:
        prefix = encoder.backbone.base_model_prefix or "bert"
        state = {f"{prefix}.{k}": v.detach().contiguous() for k, v in encoder.backbone.state_dict().items()
                 if "position_ids" not in k}
        state["linear.weight"] = _linear(encoder)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = encoder.backbone.config.to_dict()
        config["architectures"] = ["HF_ColBERT"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        encoder.tokenizer.save_pretrained(tmp)
        s, markers = encoder.settings, _markers(encoder)
        meta = {"query_token_id": markers["Q"], "doc_token_id": markers["D"], "query_token": "[Q]",
                "doc_token": "[D]", "dim": int(encoder.dim), "query_maxlen": s.query_maxlen,
                "doc_maxlen": s.doc_maxlen, "mask_punctuation": s.mask_punctuation,
                "attend_to_mask_tokens": s.attend_to_mask_tokens, "similarity": "cosine",
                "name": f"agrame-export:{encoder.source}", "checkpoint": None,
                "agrame": {"fingerprint": encoder.fingerprint(), "differences": compatibility(encoder)}}
        (tmp / "artifact.metadata").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _commit(tmp, out)


def export_pylate(encoder: Encoder, out: str | Path) -> Path:
    """A sentence-transformers folder PyLate loads with ``pylate.models.ColBERT(out)``: the
    backbone at the root, the linear layer as module ``1_Dense``, and the ColBERT settings
    (prefix tokens, lengths, mask attention, punctuation skiplist) in
    ``config_sentence_transformers.json``."""
    import string

    from safetensors.torch import save_file

    _check(encoder)
    out = Path(out)
    tmp = _fresh(out)
    try:
        encoder.backbone.save_pretrained(tmp)
        encoder.tokenizer.save_pretrained(tmp)
        s, markers = encoder.settings, _markers(encoder)
        (tmp / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}], indent=2) + "\n")
        (tmp / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": s.doc_maxlen - 1, "do_lower_case": False}, indent=2) + "\n")
        (tmp / "config_sentence_transformers.json").write_text(json.dumps({
            "query_prefix": markers["Q"], "document_prefix": markers["D"], "query_length": s.query_maxlen,
            "document_length": s.doc_maxlen, "attend_to_expansion_tokens": s.attend_to_mask_tokens,
            "skiplist_words": list(string.punctuation) if s.mask_punctuation else [],
            "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
            "agrame": {"fingerprint": encoder.fingerprint(), "differences": compatibility(encoder)}},
            indent=2) + "\n")
        dense = tmp / "1_Dense"
        dense.mkdir()
        weight = _linear(encoder)
        (dense / "config.json").write_text(json.dumps({
            "in_features": int(weight.shape[1]), "out_features": int(weight.shape[0]), "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}, indent=2) + "\n")
        save_file({"linear.weight": weight}, str(dense / "model.safetensors"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _commit(tmp, out)


def export(encoder: Encoder, out: str | Path, fmt: str) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return (export_stanford if fmt == "stanford" else export_pylate)(encoder, out)
