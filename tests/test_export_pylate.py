"""The PyLate export checked with the real PyLate 1.2.0 (issue 63, item 6).

PyLate 1.2.0 pins transformers 4.48.2 and sentence-transformers 4.0.2, so it cannot share the test environment
with the stack a plain install picks: it has its own extra and environment (README, *Run the tests*;
``.ci/run`` runs both). In the main environment this file is skipped, saying why; where
``AGRAME_REQUIRE_PYLATE=1`` (PyLate's environment) a missing PyLate is a failure, not a skip.
"""

from __future__ import annotations

import os

import pytest
import torch

from agrame.export import export
from agrame.loading import load_encoder

if os.environ.get("AGRAME_REQUIRE_PYLATE") != "1":
    pytest.importorskip("pylate", reason="PyLate pins transformers 4.48.2: its checks run in their own environment "
                                         "(pip install -e \".[pylate-test]\"; README, Run the tests)")
from pylate import models  # noqa: E402

from tests.test_export import QUERIES, SHORT, TEXTS, _colbert_order  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_encoder):
    return export(tiny_encoder, tmp_path_factory.mktemp("export") / "pylate", "pylate")


def test_pylate_folder_encodes_like_agrame_in_pylate(exported, make_tiny_encoder):
    model = models.ColBERT(model_name_or_path=str(exported), device="cpu")
    tiny = make_tiny_encoder()
    for theirs, ours in zip(model.encode(SHORT, is_query=False), tiny.encode_passages(SHORT)):
        ours = _colbert_order(ours.vectors)
        assert theirs.shape == tuple(ours.shape) and (torch.from_numpy(theirs) * ours).sum(-1).min() > 0.999
    for theirs, text in zip(model.encode(QUERIES, is_query=True), QUERIES):
        ours = tiny.encode_query(text, "Q").vectors
        assert theirs.shape == tuple(ours.shape) and (torch.from_numpy(theirs) * ours).sum(-1).min() > 0.999


@pytest.mark.slow
def test_shipped_model_encodes_alike_in_pylate(tmp_path):
    encoder = load_encoder("squad-a1")
    pl = export(encoder, tmp_path / "pl", "pylate")
    ours = [_colbert_order(e.vectors) for e in encoder.encode_passages(TEXTS)]
    pylate_docs = models.ColBERT(model_name_or_path=str(pl), device="cpu").encode(TEXTS, is_query=False)
    for b, c in zip(pylate_docs, ours):
        assert b.shape == tuple(c.shape) and (torch.from_numpy(b) * c).sum(-1).min() > 0.999
