"""Shared fixtures: a tiny randomly initialised BERT that encodes in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _make_tiny_encoder(doc_maxlen: int = 24, query_maxlen: int = 8, dim: int | None = 16, seed: int = 0):
    from benchmarks.common import tiny_encoder

    return tiny_encoder(doc_maxlen=doc_maxlen, query_maxlen=query_maxlen, dim=dim, seed=seed)


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
