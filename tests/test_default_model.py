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


@pytest.mark.slow
def test_cite_example_cites_both_passages_for_the_mixed_sentence(capsys):
    """The bundled PropCite example: sentence 2 mixes a fact of passage 1 and one of passage 2."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "examples"
    code = main(["cite", "--answer", str(root / "curie_answer.txt"), "--passages", str(root / "curie_passages.jsonl"),
                 "--format", "jsonl"])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cited = [set(r["citations"]) for r in rows]
    assert cited == [{"curie-early-life"}, {"curie-early-life", "curie-chemistry"}, {"curie-chemistry"}]
