"""Smoke test with the real default model (all-MiniLM-L6-v2 weights, zero-shot)."""

from __future__ import annotations

import json

import pytest

from agrame.cli import main


@pytest.mark.slow
def test_default_model_puts_the_answer_sentence_first(capsys, coral_file):
    code = main(["rank", "--granularity", "sentence", "--query", "What causes coral bleaching?",
                 "--passages", str(coral_file), "--format", "jsonl", "--top-k", "3"])
    assert code == 0
    top = json.loads(capsys.readouterr().out.splitlines()[0])
    assert top["passage_id"] == "coral-reefs"
    assert top["text"].startswith("Warming ocean waters cause coral bleaching")
