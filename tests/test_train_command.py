"""``agrame train`` (issue 60): pairs → train → model folder → index → search on the tiny model, each bad input
refused with exit 2 naming file, line and field and nothing written, the pieces against naive loops, and the
wheel without top-level research packages."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.lexical import LexicalCollection, LexicalIndex
from agrame.training import TrainSettings, train
from agrame.training.losses import MultiGranularKLLoss
from agrame.training.mining import choose_negatives, model_rankings
from agrame.training.pairs import Corpus, Pair, read_pairs, to_record
from agrame_app.cli import main

TOPICS = ["coral reefs", "volcanoes", "honey bees", "glaciers", "comets", "tides", "deserts", "rainforests", "owls",
          "salmon", "lightning", "earthquakes", "tulips", "penguins", "copper", "granite", "bamboo", "whales", "fungi",
          "meteors"]


def _text(topic: str) -> str:
    return (f"{topic.capitalize()} are studied by many scientists. The {topic} in the north grow every year. "
            f"Nobody knows why {topic} matter so much.")


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"id": f"d{i}", "text": _text(t)} for i, t in enumerate(TOPICS)])
    pairs = []
    for i, t in enumerate(TOPICS):
        pairs.append({"query": f"where do {t} grow every year", "positive": f"d{i}", "sentences": [1]})
        pairs.append({"query": f"who studies {t}", "positive": _text(t), "spans": [[0, 10]]})
    return tmp_path, corpus, write_jsonl(tmp_path / "pairs.jsonl", pairs)


def cli(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


TINY = ["--steps", "4", "--batch-size", "4", "--negatives", "3", "--mined", "2", "--heldout", "0.3", "--mix", "0.5", "1"]


def test_pairs_train_into_a_model_folder_that_indexes_and_searches(data, tiny_model_dir, capsys):
    tmp, corpus, pairs = data
    out = tmp / "my-model"
    code, table, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", out, "--model", tiny_model_dir,
                            *TINY], capsys)
    assert code == 0, err
    assert "mining negatives for 40 pairs from 20 passages" in err and "multi-granular" in err
    report = json.loads((out / "train.json").read_text())
    assert report["train_pairs"] == 28 and report["heldout_pairs"] == 12 and report["passages_per_pair"] == 4
    assert report["sentence_weight"] == 1.0 and report["labelled_pairs"] == 40
    assert set(report["rows"]) == {"0", "0.5", "1"}  # the start (λ = 0) is always a candidate
    assert report["chosen"]["mix"] in (0.0, 0.5, 1.0) and "(start)" in table
    assert not (tmp / ".my-model.train").exists() and not (tmp / ".my-model.tmp").exists()
    # the folder is a model as it is: agrame models, index, search, Ranker
    code, shown, _ = cli(["models", out], capsys)
    assert code == 0 and f"agrame train from {tiny_model_dir} on 40 pairs" in shown and "λ = 0 (start)" in shown
    code, _, err = cli(["index", "-p", corpus, "-i", tmp / "idx", "-m", out], capsys)
    assert code == 0, err
    code, hits, _ = cli(["search", "-i", tmp / "idx", "-f", "jsonl", "-k", "2", "where do comets grow"], capsys)
    assert code == 0 and len(hits.splitlines()) == 2
    from agrame import Ranker

    assert Ranker(str(out)).rank("comets", [("a", _text("comets"))], granularity="sentence")


def test_pairs_without_labels_train_the_passage_loss_alone(data, tiny_model_dir, capsys):
    tmp, corpus, _ = data
    pairs = write_jsonl(tmp / "plain.jsonl", [{"query": f"{how} {t}", "positive": f"d{i}"}
                                              for how in ("who studies", "what are") for i, t in enumerate(TOPICS)])
    report = train(str(pairs), tmp / "plain-model", TrainSettings(model=str(tiny_model_dir), steps=3, batch_size=4,
                                                                  negatives=2, mined=0, heldout=0.5, mixes=(1.0,)),
                   corpus=str(corpus), say=lambda _: None)
    assert report["loss"] == "passage KL only" and report["sentence_weight"] == 0.0
    assert report["chosen"]["alpha"] == "start"  # α stays the start model's: nothing taught sentences
    code, _, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp / "x", "--model", tiny_model_dir,
                        "--sentence-loss", "on", *TINY], capsys)
    assert code == 2 and "needs sentence or span labels" in err


BAD = {
    "malformed line": ('{"query": "q", "positive": "d0"}\n{"query": "q2", "positive": \n', ":2: not JSON"),
    "positive not in the corpus": ('{"query": "q", "positive": "d99"}\n', ":1: field 'positive': 'd99' is not in the corpus"),
    "sentence outside the passage": ('{"query": "q", "positive": "d0", "sentences": [7]}\n',
                                     ":1: field 'sentences': sentence 7 is outside the positive passage, which has 3"),
    "span outside the passage": ('{"query": "q", "positive": "d0", "spans": [[5, 9000]]}\n',
                                 ":1: field 'spans': span [5, 9000] is outside the positive passage"),
    "missing query": ('{"positive": "d0"}\n', ":1: field 'query': missing or empty"),
    "unknown field": ('{"query": "q", "positive": "d0", "postive": "x"}\n', ":1: field 'postive': unknown field"),
    "scores that do not fit": ('{"query": "q", "positive": "d0", "negatives": ["d1"], "scores": [1]}\n',
                               ":1: field 'scores': expected 2 finite numbers"),
    "too few for a held-out slice": ('{"query": "q", "positive": "d0"}\n' * 12,
                                     "12 pairs leave 4 for the held-out slice that chooses the mix; it needs at least 10"),
    "an empty file": ("\n", "no training pairs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exits_2_naming_the_line_and_writes_nothing(case, data, tiny_model_dir, capsys):
    tmp, corpus, _ = data
    text, message = BAD[case]
    pairs = tmp / "bad.jsonl"
    pairs.write_text(text)
    code, _, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp / "m", "--model", tiny_model_dir,
                        *TINY], capsys)
    assert code == 2 and message in err and "bad.jsonl" in err, err
    assert sorted(p.name for p in tmp.iterdir()) == ["bad.jsonl", "corpus.jsonl", "pairs.jsonl"]


def test_a_start_model_that_cannot_be_trained_is_refused(data, tmp_path, capsys):
    _, corpus, pairs = data
    code, _, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp_path / "m",
                        "--model", tmp_path / "no-such-model", *TINY], capsys)
    assert code == 2 and "no-such-model" in err and not (tmp_path / "m").exists()
    from agrame.encoder import ModelError
    from agrame.training.trainer import trainable

    class Flat:
        backbone, source = torch.nn.Linear(2, 2), "flat"

    with pytest.raises(ModelError, match="cannot be trained"):
        trainable(Flat())


def test_usage_errors_exit_2(data, tiny_model_dir, capsys):
    tmp, corpus, pairs = data
    for extra, message in ((["--mined", "9"], "--mined 9"), (["--mix", "1.5"], "mix λ in (0, 1]"),
                           (["--heldout", "1"], "share in [0, 1)")):
        with pytest.raises(SystemExit) as stop:
            code, _, err = cli(["train", "--pairs", pairs, "--out", tmp / "m", *TINY, *extra], capsys)
            assert code == 2 and message in err  # (--mined is checked in run())
            raise SystemExit(code)
        assert stop.value.code == 2
    (tmp / "full").mkdir()
    (tmp / "full" / "keep.txt").write_text("mine")
    code, _, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp / "full", "-m", tiny_model_dir,
                        *TINY], capsys)
    assert code == 2 and "not an empty folder" in err and (tmp / "full" / "keep.txt").read_text() == "mine"


def test_a_leftover_run_with_other_settings_is_refused_not_mixed_in(data, tiny_model_dir, capsys):
    tmp, corpus, pairs = data
    work = tmp / ".m.train"
    work.mkdir()
    (work / "signature").write_text("another run")
    code, _, err = cli(["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp / "m", "-m", tiny_model_dir,
                        *TINY], capsys)
    assert code == 2 and "holds another run" in err and (work / "signature").read_text() == "another run"


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30), st.integers(1, 6))
def test_the_corpus_bm25_equals_the_one_formula(seed, n_docs, q_len):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(12)]
    docs = [[rng.choice(words) for _ in range(rng.randint(1, 15))] for _ in range(n_docs)]
    query = [rng.choice(words) for _ in range(q_len)]
    slow = LexicalCollection(docs).scores(query)
    fast = LexicalIndex(docs).scores(query)
    assert all(abs(slow[i] - fast.get(i, 0.0)) < 1e-9 for i in range(n_docs))


def test_mined_rankings_equal_a_naive_maxsim_loop(tiny_encoder):
    from agrame import scoring

    texts = [_text(t) + (" Extra words here." * (i % 3)) for i, t in enumerate(TOPICS)]
    queries = ["where do comets grow", "who studies owls", "copper and granite"]
    corpus = Corpus([str(i) for i in range(len(texts))], texts)
    fast = model_rankings(tiny_encoder, queries, corpus, depth=5, passages_per_chunk=7, queries_per_batch=2)
    with torch.inference_mode():
        for q, ranked in zip(queries, fast):
            qv = tiny_encoder.encode_query(q, "Q").vectors.float()
            naive = []
            for i, doc in enumerate(tiny_encoder.encode_passages(texts)):
                doc = doc.vectors.float()
                naive.append((float(scoring.maxsim(scoring.similarity(qv, doc))), -i))
            want = [-i for _, i in sorted(naive, reverse=True)[:5]]
            assert ranked == want


def test_negatives_come_in_the_recipe_order():
    corpus = Corpus(list("abcdef"), ["A", "B", "C", "D", "E", "F"])
    pair = Pair("q", "A", negatives=["F"])
    # own first, then 2 of the model's, then BM25's (never the positive, nothing twice)
    assert choose_negatives(pair, corpus, [0, 1, 2, 3], [1, 4, 5], count=5, mined=2) == ["F", "B", "C", "E", "D"]


def test_records_carry_labels_and_scores():
    pair = Pair("q", "One. Two. Three.", negatives=["Other."], answer_sentences=[1], scores=[3.0, 1.0])
    record = to_record(pair, ["Other.", "Mined."])
    assert [p["teacher"] for p in record["passages"]] == [3.0, 1.0, 1.0]  # a mined one: the lowest given
    assert record["passages"][0]["teacher_sentences"] == [0.0, 5.0, 0.0] and record["sentence_labels"]


def test_unlabelled_queries_leave_the_sentence_loss():
    torch.manual_seed(0)
    b, p, s = 4, 3, 5
    t_p, s_p = torch.randn(b, p), torch.randn(b, p)
    t_s, s_s = torch.randn(b, p, s), torch.randn(b, p, s)
    mask = torch.ones(b, p, s, dtype=torch.bool)
    loss = MultiGranularKLLoss()
    every = loss(t_p, s_p, t_s, s_s, mask)
    assert torch.allclose(loss(t_p, s_p, t_s, s_s, mask, labelled=torch.ones(b, dtype=torch.bool))["sentence"],
                          every["sentence"])
    keep = torch.tensor([True, False, True, False])
    some = loss(t_p, s_p, t_s, s_s, mask, labelled=keep)["sentence"]
    alone = loss(t_p[keep], s_p[keep], t_s[keep], s_s[keep], mask[keep])["sentence"]
    assert torch.allclose(some, alone)


def test_the_pairs_reader_takes_ids_texts_and_both_label_kinds(data):
    tmp, corpus, pairs = data
    from agrame.training.pairs import read_corpus

    read = read_pairs(str(pairs), read_corpus(str(corpus)))
    assert len(read) == 40 and read[0].positive == _text(TOPICS[0]) and read[0].answer_sentences == [1]
    assert read[1].answer_sentences == [0]  # span [0, 10] lies in the first sentence


def test_a_run_stopped_by_its_time_budget_resumes_with_the_same_command(data, tiny_model_dir, capsys):
    tmp, corpus, pairs = data
    args = ["train", "--pairs", pairs, "--corpus", corpus, "--out", tmp / "m", "--model", tiny_model_dir, *TINY]
    code, _, err = cli([*args, "--minutes", "0.00001"], capsys)
    assert code == 0 and "stopped at step 1 of 4" in err and not (tmp / "m").exists()
    assert (tmp / ".m.train" / "student" / "checkpoint.pt").exists()
    code, _, err = cli(args, capsys)  # (the time budget is no part of the run's signature)
    assert code == 0 and (tmp / "m" / "train.json").exists(), err
    report = json.loads((tmp / "m" / "train.json").read_text())
    assert set(report["seconds"]) == {"read", "mine", "train", "mix", "total"}
    assert "resumed at step 1" in " ".join(report["training_log"]) and not (tmp / ".m.train").exists()


def test_prepared_records_train_as_the_recipe_did(data, tiny_encoder, tmp_path, capsys):
    """``--records``/``--heldout-records``: the research scripts' files in one call; a start without the [Q']
    marker (zero-shot-128, the recipe's start) learns it, as training.student's student_encoder adds it."""
    tmp, corpus, pairs = data
    from agrame.training.pairs import read_corpus

    read = read_pairs(str(pairs), read_corpus(str(corpus)))
    texts = [_text(t) for t in TOPICS]
    recs = [to_record(p, [t for t in texts if t != p.positive][:3]) for p in read]
    train_file, held_file = write_jsonl(tmp / "train-records.jsonl", recs[:30]), write_jsonl(tmp / "held.jsonl", recs[30:])
    start = tmp / "no-qprime"
    tiny_encoder.with_settings(markers={**tiny_encoder.settings.markers, "Q'": None}, span_query_marker="Q").save(start)
    code, _, err = cli(["train", "--records", f"{train_file}@2", "--heldout-records", f"{held_file}:0:8",
                        "--out", tmp / "m", "--model", start, "--steps", "3", "--batch-size", "4", "--mix", "1"],
                       capsys)
    assert code == 0, err
    report = json.loads((tmp / "m" / "train.json").read_text())
    assert report["train_pairs"] == 60 and report["heldout_pairs"] == 8 and set(report["rows"]["1"]) == {"held"}
    code, _, err = cli(["train", "--records", train_file, "--heldout", "0", "--out", tmp / "unmixed", "--model", start,
                        "--steps", "2", "--batch-size", "4"], capsys)
    assert code == 0, err
    saved = json.loads((tmp / "unmixed" / "agrame.json").read_text())
    assert saved["markers"]["Q'"] == "[unused2]" and saved["span_query_marker"] == "Q'"
    code, _, err = cli(["train", "--records", train_file, "--out", tmp / "m2", "--model", start], capsys)
    assert code == 2 and "needs --heldout-records" in err
    code, _, err = cli(["train", "--records", train_file, "--corpus", corpus, "--out", tmp / "m2"], capsys)
    assert code == 2 and "--corpus goes with --pairs" in err


def test_the_scifact_measure_runs_both_losses_then_reports(tmp_path):
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run(["bash", str(repo / "benchmarks" / "train_scifact.sh")], capture_output=True, text=True,
                         env={**__import__("os").environ, "RUN": "echo", "AGRAME_RUNS": str(tmp_path)}, check=True).stdout
    trains = [line for line in out.splitlines() if line.startswith("agrame train")]
    assert len(trains) == 2 and "--sentence-loss off" in trains[1] and "--sentence-loss" not in trains[0]
    assert all(f"--pairs {tmp_path}/train-scifact-r2/pairs.jsonl --corpus {tmp_path}/train-scifact-r2/corpus.jsonl" in t
               for t in trains)
    assert out.splitlines()[-1].startswith("python -m benchmarks.train_scifact report")


def test_attention_dropout_is_set_on_every_attention_block_and_nothing_else(tiny_encoder):
    import copy

    from agrame.training.student import set_attention_dropout

    encoder = copy.deepcopy(tiny_encoder)
    blocks = len(encoder.backbone.encoder.layer)
    for module in encoder.backbone.modules():  # hidden dropout off, so only attention dropout can differ
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids = torch.randint(5, 90, (2, 12))
    mask = torch.ones_like(ids)

    def twice() -> bool:
        encoder.backbone.train()
        a = encoder.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        b = encoder.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        return torch.equal(a, b)

    assert set_attention_dropout(encoder, 0.5) == blocks
    assert not twice()  # the attention's dropout draws
    assert set_attention_dropout(encoder, 0.0) == blocks
    assert twice()
    assert encoder.backbone.config.attention_probs_dropout_prob == 0.0
    with pytest.raises(ValueError, match="attention dropout"):
        set_attention_dropout(encoder, 1.0)


def test_attention_dropout_out_of_range_is_a_usage_error(data, tiny_model_dir, capsys):
    tmp, corpus, pairs = data
    with pytest.raises(SystemExit) as stop:
        main(["train", "--pairs", str(pairs), "--out", str(tmp / "m"), "--attention-dropout", "1.5"])
    assert stop.value.code == 2 and "[0, 1) or 'model'" in capsys.readouterr().err
    assert not (tmp / "m").exists()
