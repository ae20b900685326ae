"""Student scorer vs the inference path, resumable deterministic training, training data rules."""

from __future__ import annotations

import pytest
import torch

from agrame.ranker import Ranker
from agrame.spans import split_sentences
from training.data import answer_sentences
from agrame.training.losses import MultiGranularKLLoss
from agrame.training.loop import LoopSettings, batches, train
from agrame.training.student import StudentScorer, make_loss, trainable_parameters

TEXTS = ["Reefs bleach in warm water. Polyps build reefs.", "Bleach whitens cloth. It is toxic.",
         "The tower is tall. It was built in 1889.", "Fish swim. Birds fly."]


def record(question, order, teacher=(3.0, 0.0, -1.0)):
    passages = []
    for k, i in enumerate(order):
        sentences = [list(s) for s in split_sentences(TEXTS[i])]
        passages.append({"text": TEXTS[i], "sentences": sentences, "teacher": teacher[k],
                         "teacher_sentences": [1.0 - j for j in range(len(sentences))]})
    return {"question": question, "passages": passages}


def assert_scores_equal_ranker(ranker, corpus, record_, passage, sentence, mask) -> None:
    """The student's passage and sentence scores of one query (``[P]``, ``[P, S]``) equal the Ranker's
    on ``corpus`` (the record's passages, encoded as the student sees them)."""
    for hit in ranker.rank(record_["question"], corpus, "passage", top_k=None):
        assert float(passage[int(hit.passage_id)]) == pytest.approx(hit.score, abs=1e-4)
    for hit in ranker.rank(record_["question"], corpus, "sentence", top_k=None):
        p = int(hit.passage_id)
        s = [tuple(x) for x in record_["passages"][p]["sentences"]].index((hit.start, hit.end))
        assert mask[p, s]
        assert float(sentence[p, s]) == pytest.approx(hit.span_score, abs=1e-4)


@pytest.fixture
def encoder(marked_encoder):
    return marked_encoder


@pytest.mark.parametrize("passage_marker", ["[unused0]", None])  # None: training.student --query-marker none
def test_student_scores_equal_the_ranker(encoder, passage_marker):
    encoder = encoder.with_settings(markers={**encoder.settings.markers, "Q": passage_marker})
    batch = [record("why do reefs bleach", [0, 1, 2]), record("who built the tower in 1889", [2, 3, 0])]
    scorer = StudentScorer(encoder, "Q'").eval()
    with torch.no_grad():
        passage, sentence, mask = scorer(batch)
    ranker = Ranker(encoder, alpha=0.0)
    for b, r in enumerate(batch):
        corpus = ranker.encode([(str(k), p["text"]) for k, p in enumerate(r["passages"])])
        assert_scores_equal_ranker(ranker, corpus, r, passage[b], sentence[b], mask[b])
    assert not mask[0, 0, 2:].any()  # two sentences, the rest is padding


def test_training_is_deterministic_and_resumes(encoder, tmp_path, make_tiny_encoder):
    examples = [record(q, [0, 1, 2]) for q in ("reefs", "bleach", "tower", "fish", "water", "build")]

    def run(folder, steps_first):
        torch.manual_seed(0)
        enc = make_tiny_encoder(doc_maxlen=64, query_maxlen=8, seed=3).with_settings(
            markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"})
        params = trainable_parameters(enc, 1)
        scorer = StudentScorer(enc, "Q'")
        loss = make_loss(scorer, MultiGranularKLLoss())
        settings = LoopSettings(steps=4, batch_size=2, lr=1e-3, checkpoint_every=1, seed=1)
        if steps_first < 4:
            train(scorer, examples, loss, LoopSettings(**{**settings.__dict__, "minutes": 0.0}), folder,
                  params=params)  # stops after one step, as if interrupted
        result = train(scorer, examples, loss, settings, folder, params=params)
        assert result["done"]
        return enc

    a = run(tmp_path / "a", 4)
    b = run(tmp_path / "b", 1)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.allclose(x, y, atol=1e-6), name
    assert (tmp_path / "a" / "train.log").exists()


def test_a_time_budget_stop_leaves_the_final_model_only_when_asked(tmp_path, make_tiny_encoder):
    # a device call's student capped by --minutes must still leave its model (nothing resumes it there)
    examples = [record(q, [0, 1, 2]) for q in ("reefs", "bleach", "tower", "fish")]
    for final_at_deadline in (False, True):
        enc = make_tiny_encoder(doc_maxlen=64, query_maxlen=8, seed=3)
        scorer = StudentScorer(enc, "Q'")
        folder = tmp_path / str(final_at_deadline)
        result = train(scorer, examples, make_loss(scorer, MultiGranularKLLoss()),
                       LoopSettings(steps=4, batch_size=2, lr=1e-3, minutes=0.0, final_at_deadline=final_at_deadline),
                       folder, params=trainable_parameters(enc, 1), save=lambda path: enc.save(path))
        assert not result["done"] and result["step"] == 1
        assert (folder / "final" / "agrame.json").exists() == final_at_deadline


def test_only_marker_rows_of_the_embedding_learn(encoder):
    params = trainable_parameters(encoder, 1)
    emb = encoder.backbone.get_input_embeddings().weight
    before = emb.detach().clone()
    scorer = StudentScorer(encoder, "Q'")
    loss = make_loss(scorer, MultiGranularKLLoss())([record("reefs bleach", [0, 1, 2])])
    loss.backward()
    torch.optim.AdamW([{"params": [p for p in params if p is not emb]},
                       {"params": [emb], "weight_decay": 0.0}], lr=0.1).step()
    changed = (emb.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == sorted({encoder.marker_id("Q"), encoder.marker_id("Q'")})
    frozen = encoder.backbone.encoder.layer[0].attention.self.query.weight
    assert not frozen.requires_grad


def test_batches_replay_and_answer_sentences():
    full = list(batches(10, 3, seed=5, start_step=0, steps=7))
    assert list(batches(10, 3, seed=5, start_step=4, steps=7)) == full[4:]
    assert all(len(idx) == 3 for _, idx in full)
    assert answer_sentences([(0, 10), (11, 20), (21, 30)], 12, 25) == [1, 2]
    assert answer_sentences([(0, 10), (11, 20)], 3, 5) == [0]


@pytest.mark.parametrize("kind", ["one-pass", "marked", "passage"])
def test_teachers_train_step_and_roundtrip(kind, tiny_model_dir, tmp_path):
    from training.teachers import CrossEncoder

    teacher = CrossEncoder(kind, str(tiny_model_dir), max_length=48)
    batch = [record("why do reefs bleach", [0, 1, 2])]
    batch[0]["passages"][0]["answer_sentences"] = [0]
    for p in batch[0]["passages"][1:]:
        p["answer_sentences"] = []
    loss = teacher.loss(batch)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    teacher.save(tmp_path / kind)
    again = CrossEncoder.load(tmp_path / kind)
    with torch.no_grad():
        if kind != "marked":
            assert torch.allclose(teacher.eval().passage_logits("q", batch[0]["passages"])[0],
                                  again.passage_logits("q", batch[0]["passages"])[0], atol=1e-5)
        if kind != "passage":
            s = again.sentence_logits("why", batch[0]["passages"][0])
            assert s.shape == (len(batch[0]["passages"][0]["sentences"]),)


def test_one_pass_markers_sit_before_each_sentence(tiny_model_dir):
    from training.teachers import CrossEncoder

    teacher = CrossEncoder("one-pass", str(tiny_model_dir), max_length=20)
    text = "Reefs bleach in warm water. Polyps build reefs. Fish swim."
    sentences = split_sentences(text)
    ids, where = teacher._one_pass_ids("why", text, sentences)
    assert len(ids) <= 20 and ids[-1] == teacher.tokenizer.sep_token_id
    kept = [w for w in where if w >= 0]
    assert all(ids[w] == teacher.marker_id for w in kept)
    assert where[-1] == -1 or len(kept) == 3  # a sentence past max_length gets no marker
    assert CrossEncoder.marked_text("ab cd ef", (3, 5)) == "ab $ cd $ ef"


@pytest.mark.parametrize("kind", ["marked", "one-pass"])
def test_listwise_sentence_term_is_the_answer_cross_entropy(kind, tiny_model_dir):
    from training.teachers import CrossEncoder

    teacher = CrossEncoder(kind, str(tiny_model_dir), max_length=48).eval()
    batch = [record("why do reefs bleach", [0, 1, 2])]
    batch[0]["passages"][0]["answer_sentences"] = [1]
    for p in batch[0]["passages"][1:]:
        p["answer_sentences"] = []
    with torch.no_grad():
        plain = teacher.loss(batch)
        teacher.listwise_sentences = True
        both = teacher.loss(batch)
        logits = teacher.sentence_logits("why do reefs bleach", batch[0]["passages"][0])
    assert len(logits) > 1
    expected = -torch.log_softmax(logits, dim=0)[1]  # one answer: plain cross-entropy
    assert torch.allclose(both - plain, expected, atol=1e-5)
