"""Every benchmark command on a tiny sample with the tiny model (CI smoke; needs ../shared/data)."""

from __future__ import annotations

import json

import pytest

from benchmarks.common import data_path

pytestmark = pytest.mark.skipif(not data_path().is_dir(), reason=f"data bundle not found at {data_path()}")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGRAME_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("dataset, method", [
    ("squad-dev", "bm25"),
    ("squad-dev", "colbert-zeroshot-psg"),
    ("squad-dev", "colbert-zeroshot-sent"),
    ("squad-dev", "single-vector"),
    ("nq-oracle", "colbert-zeroshot-psg"),
    ("webq", "bm25"),
])
def test_open_domain_smoke(tmp_path, tiny_model_dir, dataset, method):
    from benchmarks import open_domain

    out = tmp_path / "result.json"
    open_domain.main(["--dataset", dataset, "--method", method, "--limit", "3", "--pool-limit", "40",
                      "--model", str(tiny_model_dir), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["sample"]["questions"] == 3 and result["pool_passages"] <= 43
    for key in ("psg_p1", "psg_r5", "first_stage_r100"):
        assert 0 <= result["metrics"][key] <= 100
    if dataset == "squad-dev":  # the gold paragraph is always in the restricted pool
        assert result["sample"]["with_gold_sentence"] == 3
    if dataset == "webq":
        assert "answerable_share" in result
    assert result["command"].startswith(f"python -m benchmarks.open_domain --dataset {dataset} --method {method}")
