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
    assert result["searched"] and result["dom_hits"] == 3
    assert result["dom_first_passage"] == result["api_top"]["passage_id"]
    assert result["dom_first_outlined"] == result["api_top"]["text"]


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
