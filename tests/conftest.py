"""Shared fixtures: a tiny randomly initialised BERT that encodes in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _make_tiny_encoder(doc_maxlen: int = 24, query_maxlen: int = 8, dim: int | None = 16, seed: int = 0):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from agrame.encoder import Encoder, EncoderSettings, default_model_path

    torch.manual_seed(seed)
    # The real MiniLM vocabulary keeps tokenisation (unicode, word pieces, offsets) realistic.
    tokenizer = BertTokenizerFast(vocab_file=str(default_model_path() / "vocab.txt"), do_lower_case=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    backbone = BertModel(config, add_pooling_layer=False)
    projection = torch.nn.Linear(32, dim, bias=False) if dim else None
    settings = EncoderSettings(dim=dim, doc_maxlen=doc_maxlen, doc_overlap=6, query_maxlen=query_maxlen)
    return Encoder(backbone, tokenizer, settings, projection, source="tiny-test-bert")


@pytest.fixture(scope="session")
def tiny_encoder():
    return _make_tiny_encoder()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_encoder) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny"
    tiny_encoder.save(path)
    return path


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "other"
    _make_tiny_encoder(seed=1).save(path)
    return path


@pytest.fixture(scope="session")
def make_tiny_encoder():
    return _make_tiny_encoder


@pytest.fixture
def marked_encoder(make_tiny_encoder):
    """The tiny model with AGRaME's query markers (what a training student looks like)."""
    enc = make_tiny_encoder(doc_maxlen=64, query_maxlen=8)
    return enc.with_settings(markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"},
                             span_query_marker="Q'")


@pytest.fixture
def coral_file() -> Path:
    return Path(__file__).resolve().parent.parent / "examples" / "coral.jsonl"
