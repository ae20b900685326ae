"""The web page in a real headless browser (runs where Debian's Chromium is installed:
``apt-get install chromium``; ``python -m benchmarks.browser_check`` is the same check by hand)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from benchmarks.browser_check import check_page, find_browser  # noqa: E402

BROWSER = find_browser()


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_page_outlines_the_top_sentence(tmp_path, tiny_encoder, tiny_model_dir, coral_file):
    from agrame.index import build_index
    from agrame.io import read_passages
    from agrame_app.serve import create_app

    build_index(tiny_encoder, read_passages(str(coral_file)), tmp_path / "ix", progress=False)
    result = check_page(create_app(tmp_path / "ix", model=str(tiny_model_dir)), "coral bleaching", BROWSER)
    assert result["searched"] and sorted(r for ranks in result["dom_ranks"] for r in ranks) == [1, 2, 3]
    # sentence hits grouped under their passage: each passage once, in the order of its best hit, every hit outlined
    assert result["dom_passages"] == result["api_passages"]
    assert result["dom_outlines"] == [len(ranks) for ranks in result["dom_ranks"]]
    assert result["dom_first_passage"] == result["api_top"]["passage_id"]
    assert result["dom_first_outlined"] == result["api_top"]["text"]
    # token-to-token explain: every query token's row pairs with a token shown in the passage
    assert result["dom_pair_rows"] > 0 and result["dom_pairs_unmatched"] == 0


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_page_filter_field_restricts_the_results(tmp_path, tiny_encoder, tiny_model_dir, coral_file):
    from agrame.corpus import Passage
    from agrame.index import build_index
    from agrame.io import read_passages
    from agrame_app.serve import create_app

    passages = [Passage(p.id, p.text, metadata={"keep": i % 2 == 0}) for i, p in enumerate(read_passages(str(coral_file)))]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    result = check_page(create_app(tmp_path / "ix", model=str(tiny_model_dir)), "coral bleaching", BROWSER,
                        filter={"keep": True})
    assert result["searched"] and set(result["dom_passages"]) == {p.id for p in passages[::2]}
    assert result["dom_first_passage"] == result["api_top"]["passage_id"]


def _answers(passages, n: int = 20, seed: int = 0):
    """``n`` answers made of the passages' sentences, shuffled and mixed (the page's cite view is what is tried)."""
    import random

    from agrame.spans import split_sentences

    rng = random.Random(seed)
    pool = [p.text[a:b] for p in passages for a, b in split_sentences(p.text)]
    return [" ".join(rng.sample(pool, rng.randint(1, 4))) for _ in range(n)]


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_cite_tab_shows_each_passage_once_where_the_cli_puts_it(tmp_path, tiny_model_dir):
    # issue 63: the page repeated markers ("[1][1][2][2][2]") and put them after the full stop
    from pathlib import Path

    from agrame.io import read_passages
    from agrame_app.serve import create_app

    from benchmarks.browser_check import check_cite

    examples = Path(__file__).resolve().parent.parent / "examples"
    passages = read_passages(str(examples / "curie_passages.jsonl"))
    app = create_app(None, model=str(tiny_model_dir))
    answers = [(examples / "curie_answer.txt").read_text().strip()] + _answers(passages, 20)
    duplicated = 0
    for k, answer in enumerate(answers):
        result = check_cite(app, answer, [p.text for p in passages], BROWSER,
                            screenshot=tmp_path / "cite.png" if k == 0 else None)
        assert result["cited"] and result["favicon"], result
        assert result["dom_markers"] == result["api_markers"], (answer, result)
        assert result["markers_before_closing_punctuation"], (answer, result)
        duplicated += result["duplicated"]
    assert duplicated == 0
    assert (tmp_path / "cite.png").stat().st_size > 1000
