"""The scaled recipe's pieces: in-batch negatives, layer-wise rates, data mixing, mined negatives,
resumable data writing, WiSE-FT interpolation and the held-out evaluation."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.utils._python_dispatch

from agrame.training.interpolate import interpolate, projection_agreement
from agrame.training.losses import MultiGranularKLLoss
from training.mined import choose_negatives, heldout_articles, main as mined_main, unseen, write_resumable
from agrame.training.student import (StudentScorer, in_batch_teacher, layerwise_groups, make_loss, read_mixture,
                              trainable_parameters)

from test_training import record


@pytest.fixture
def encoder(marked_encoder):
    return marked_encoder


def test_in_batch_scores_hold_every_pair_and_the_own_block(encoder):
    batch = [record("why do reefs bleach", [0, 1, 2]), record("who built the tower", [2, 3, 0])]
    with torch.no_grad():
        own, sentence, _ = StudentScorer(encoder, "Q'").eval()(batch)
        every, sentence_ib, _ = StudentScorer(encoder, "Q'", in_batch=True).eval()(batch)
    assert every.shape == (2, 6)
    for b in range(2):  # the own block is the plain score; every other column scores the same text alike
        assert torch.allclose(every[b, 3 * b:3 * b + 3], own[b], atol=1e-5)
        for c in range(6):
            text = batch[c // 3]["passages"][c % 3]["text"]
            same = [p for p, x in enumerate(batch[b]["passages"]) if x["text"] == text]
            if same:
                assert float(every[b, c]) == pytest.approx(float(own[b, same[0]]), abs=1e-4)
    assert torch.allclose(sentence, sentence_ib)
    # The sentence mask against a loop over the passages' token → sentence tables.
    scorer = StudentScorer(encoder, "Q'")
    _, mask = scorer(batch)[1:]
    _, _, _, seg_ids, n_sent, width = scorer.passage_batch([p for r in batch for p in r["passages"]])
    for k, seg in enumerate(seg_ids):
        expected = [bool((seg == s).any()) for s in range(n_sent)]
        assert mask[k // 3, k % 3].tolist() == expected


def test_in_batch_teacher_and_loss():
    t = torch.tensor([[5.0, 0.0, 1.0], [2.0, -1.0, 0.0]])
    full = in_batch_teacher(t)
    assert full.tolist() == [[5.0, 0.0, 1.0, 0.0, 0.0, 0.0], [-1.0, -1.0, -1.0, 2.0, -1.0, 0.0]]
    loss = MultiGranularKLLoss()
    s_sent = torch.randn(2, 3, 4)
    t_sent = torch.randn(2, 3, 4)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    student = torch.randn(2, 6)
    out = loss(full, student, t_sent, s_sent, mask, own_passages=3)
    # The sentence weights come from each query's own block: equal to the plain loss's L_sent.
    plain = loss(t, student[:, :3], t_sent, s_sent, mask)
    assert float(out["sentence"]) == pytest.approx(float(plain["sentence"]), abs=1e-6)


def test_in_batch_training_step_runs(encoder):
    trainable_parameters(encoder, 1)
    scorer = StudentScorer(encoder, "Q'", in_batch=True)
    value = make_loss(scorer, MultiGranularKLLoss())([record("reefs", [0, 1, 2]), record("tower", [2, 3, 0])])
    value.backward()
    assert torch.isfinite(value)


def test_layerwise_groups_scale_by_depth(encoder):
    params = trainable_parameters(encoder, 2)
    groups = layerwise_groups(encoder, params, 0.5)
    blocks = list(encoder.backbone.encoder.layer)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    assert all(scale[id(p)] == 1.0 for p in blocks[-1].parameters())
    assert all(scale[id(p)] == 0.5 for p in blocks[-2].parameters())
    assert scale[id(encoder.projection.weight)] == 1.0
    assert sum(len(g["params"]) for g in groups) == len(params)


def test_loop_applies_group_rates(encoder, tmp_path):
    from agrame.training.loop import LoopSettings, train

    params = trainable_parameters(encoder, 2)
    groups = layerwise_groups(encoder, params, 0.0)  # rate 0 below the top layer: it must not move
    low = list(encoder.backbone.encoder.layer)[-2].attention.self.query.weight
    top = list(encoder.backbone.encoder.layer)[-1].attention.self.query.weight
    low0, top0 = low.detach().clone(), top.detach().clone()
    scorer = StudentScorer(encoder, "Q'")
    train(scorer, [record("reefs", [0, 1, 2])] * 2, make_loss(scorer, MultiGranularKLLoss()),
          LoopSettings(steps=2, batch_size=1, lr=1e-2, warmup=0.0, weight_decay=0.0), tmp_path, params=groups)
    assert torch.equal(low.detach(), low0)
    assert not torch.equal(top.detach(), top0)


def test_read_mixture_repeats_and_refuses_mixed_counts(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    a.write_text("\n".join(json.dumps({"q": i, "passages": [1, 2]}) for i in range(3)) + "\n")
    b.write_text(json.dumps({"q": "b", "passages": [1, 2]}) + "\n")
    c.write_text(json.dumps({"q": "c", "passages": [1, 2, 3]}) + "\n")
    got = read_mixture([str(a), f"{b}@3"])
    assert [r["q"] for r in got] == [0, 1, 2, "b", "b", "b"]
    with pytest.raises(SystemExit, match="mix"):
        read_mixture([str(a), str(c)])
    with pytest.raises(SystemExit, match="FILE@N"):
        read_mixture([f"{a}@x"])


def test_choose_negatives_mixes_model_and_bm25_and_skips_false_negatives():
    texts = ["gold text", "Paris is here", "model one", "model two", "bm25 one", "bm25 two", "model three"]
    # 1 holds the answer: never a negative; the gold paragraph is skipped in both rankings.
    got = choose_negatives(0, "Paris", by_model=[0, 1, 2, 3, 6], by_bm25=[1, 4, 2, 5], texts=texts,
                           negatives=4, mined=2)
    assert got == [2, 3, 4, 5]
    # BM25 runs short: the model's ranking fills the rest; too few clean ones: None.
    assert choose_negatives(0, "Paris", [2, 3, 6], [4], texts, 4, 1) == [2, 4, 3, 6]
    assert choose_negatives(0, "Paris", [1], [4], texts, 3, 1) is None
    assert choose_negatives(0, "Paris", [], [4, 5, 2], texts, 2, 2) == [4, 5]  # no model: BM25 only


def test_heldout_articles_are_seeded():
    assert heldout_articles(100, 0.05, 0) == heldout_articles(100, 0.05, 0)
    assert len(heldout_articles(100, 0.05, 0)) == 5
    assert heldout_articles(100, 0.0, 0) == set()


def test_unseen_keeps_held_out_records_whose_gold_passage_was_never_a_training_positive(tmp_path):
    def rec(qid, gold, negative):
        return {"qid": qid, "passages": [{"pid": gold, "positive": True}, {"pid": negative, "positive": False}]}

    # a training *negative* is not "seen": only the positives were taught
    train = [rec("t1", "a", "b"), rec("t2", "c", "d")]
    held = [rec("h1", "a", "x"), rec("h2", "b", "c"), rec("h3", "e", "a")]
    assert [r["qid"] for r in unseen(held, train)] == ["h2", "h3"]
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("held", "train", "out")}
    for name, records in (("held", held), ("train", train)):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in records))
    mined_main(["unseen", "--heldout", str(paths["held"]), "--train", str(paths["train"]), "--out", str(paths["out"])])
    assert [json.loads(line)["qid"] for line in paths["out"].read_text().splitlines()] == ["h2", "h3"]
    with pytest.raises(SystemExit) as exit_:
        mined_main(["unseen", "--heldout", str(tmp_path / "missing.jsonl"), "--train", str(paths["train"]),
                    "--out", str(tmp_path / "never.jsonl")])
    assert exit_.value.code == 2 and not (tmp_path / "never.jsonl").exists()


def test_guard_records_take_bm25s_first_answer_passage_and_clean_negatives():
    from training.mined import guard_records

    texts = ["Paris is the capital of France. It lies on the Seine.", "France borders Spain. Lyon is in France.",
             "The capital of Italy is Rome.", "Capital letters begin sentences.", "Berlin is in Germany.",
             "Madrid is the capital of Spain."]
    questions = [("q-0", "what is the capital of france", ["Paris"]), ("q-1", "capital of mars", ["Zorg"]),
                 ("q-2", "where does the seine flow", ["France"])]
    out = list(guard_records(questions, texts, negatives=2, limit=5))
    assert [r["qid"] for r in out] == ["q-0", "q-2"]  # no passage holds "Zorg": skipped
    first = out[0]["passages"]
    assert first[0]["pid"] == "guard-0" and first[0]["positive"] and first[0]["answer_sentences"] == [0]
    assert len(first) == 3 and not any("Paris" in p["text"] for p in first[1:])
    assert all(not p["positive"] and p["answer_sentences"] == [] for p in first[1:])
    assert len(list(guard_records(questions, texts, negatives=2, limit=1))) == 1


def test_a_larger_guard_set_outside_the_distill_questions_extends_the_smaller_one(tmp_path, monkeypatch):
    # training/scale.sh GUARDS=N: guard-500 first, the distill questions without it, then the larger guard
    # without the distill questions: the same shuffle, so the larger set starts with the smaller one.
    from training.mined import distill_records, guard_records, main as mined

    texts = ["Paris is the capital of France. It lies on the Seine.", "France borders Spain.",
             "The capital of Italy is Rome.", "Berlin is in Germany.", "Madrid is the capital of Spain.",
             "Vienna is the capital of Austria."]
    questions = [("q-0", "capital of france", ["Paris"]), ("q-1", "capital of italy", ["Rome"]),
                 ("q-2", "where is berlin", ["Germany"]), ("q-3", "capital of spain", ["Madrid"]),
                 ("q-4", "capital of austria", ["Vienna"]), ("q-5", "where is the seine", ["France"])]
    small = list(guard_records(questions, texts, negatives=2, limit=1))
    held = {r["qid"] for r in small}
    distill = {r["qid"] for r in distill_records([q for q in questions if q[0] not in held], texts, passages=3, limit=2)}
    large = list(guard_records([q for q in questions if q[0] not in distill], texts, negatives=2, limit=3))
    assert large[:1] == small and len(large) == 3
    assert not distill & {r["qid"] for r in large} and not distill & held
    # the command line: `guard --exclude` drops those questions before the first answer-holding ones are taken
    monkeypatch.setattr("training.mined.dpr_questions", lambda topics, seed: list(questions))
    monkeypatch.setattr("training.mined.guard_corpus", lambda: list(texts))
    (tmp_path / "distill.jsonl").write_text("".join(json.dumps({"qid": q}) + "\n" for q in sorted(distill)))
    mined(["guard", "--topics", "nq-dev", "--negatives", "2", "--limit", "3", "--exclude",
           str(tmp_path / "distill.jsonl"), "--out", str(tmp_path / "large.jsonl")])
    written = [json.loads(line) for line in (tmp_path / "large.jsonl").read_text().splitlines()]
    assert [r["qid"] for r in written] == [r["qid"] for r in large]
    with pytest.raises(SystemExit) as exit_:
        mined(["guard", "--topics", "nq-dev", "--exclude", str(tmp_path / "missing.jsonl"),
               "--out", str(tmp_path / "never.jsonl")])
    assert exit_.value.code == 2 and not (tmp_path / "never.jsonl").exists()


def test_write_resumable_continues_without_duplicates(tmp_path):
    out = tmp_path / "out.jsonl"
    items = [{"i": i, "skipped": i % 7 == 3} for i in range(1000)]

    def records(start, stop_at=None):
        for k in range(start, len(items)):
            if stop_at is not None and k == stop_at:
                raise KeyboardInterrupt
            yield dict(items[k])

    with pytest.raises(KeyboardInterrupt):
        write_resumable(lambda s: records(s, stop_at=600), len(items), out, "test")
    assert not out.exists()
    written = write_resumable(records, len(items), out, "test")
    got = [json.loads(line)["i"] for line in out.read_text().splitlines()]
    assert got == [i for i in range(1000) if i % 7 != 3]
    assert written == len(got)
    assert not list(tmp_path.glob("*.partial*"))


def test_interpolation_endpoints_and_midpoint(make_tiny_encoder):
    a = make_tiny_encoder(seed=1, dim=16)
    b = make_tiny_encoder(seed=2, dim=16)
    with torch.no_grad():
        b.projection.weight.copy_(a.projection.weight + 0.01)
    assert projection_agreement(a, b) > 0.9
    for mix in (0.0, 0.5, 1.0):
        m = interpolate(a, b, mix)
        for (name, x), y, z in zip(m.backbone.state_dict().items(), a.backbone.state_dict().values(),
                                   b.backbone.state_dict().values()):
            if x.is_floating_point():
                assert torch.allclose(x, (1 - mix) * y + mix * z, atol=1e-6), name
        assert torch.allclose(m.projection.weight, (1 - mix) * a.projection.weight + mix * b.projection.weight)
        assert m.settings == b.settings
    with pytest.raises(ValueError):
        interpolate(a, b, 1.5)


def test_held_out_evaluation_finds_the_planted_answer(encoder):
    from agrame.training.choose_mix import best_setting, evaluate

    r = record("bleach reefs warm water", [0, 1, 2], teacher=(5.0, 0.0, 0.0))
    r["passages"][0]["answer_sentences"] = [0]
    out = evaluate(encoder, [r, r], grid=(0.0, 1.0))
    assert out["questions"] == 2 and set(out["sentence_p1_by_alpha"]) == {"0.0", "1.0"}
    assert all(v in (0.0, 100.0) for v in out["sentence_p1_by_alpha"].values())
    rows = {"mix=0": {"x": {"sentence_p1_by_alpha": {"0.5": 40.0, "1.0": 50.0}}},
            "mix=1": {"x": {"sentence_p1_by_alpha": {"0.5": 45.0, "1.0": 45.0}}}}
    assert best_setting(rows) == {"model": "mix=0", "alpha": 1.0, "mean_sentence_p1": 50.0}


def test_guard_sets_only_constrain_the_mix():
    from agrame.training.choose_mix import best_setting, guard_deficit

    def row(held, guard_psg, guard_sent):
        return {"squad": {"passage_p1": 90.0, "sentence_p1_by_alpha": {"0.5": held, "1.0": held - 1}},
                "nq": {"passage_p1": guard_psg, "sentence_p1_by_alpha": {"0.5": guard_sent, "1.0": guard_sent + 3}}}

    reference = row(0.0, 60.0, 40.0)  # its best guard sentence P@1 is at α 1: 43
    rows = {"mix=0": row(70.0, 60.0, 40.0), "mix=0.5": row(74.0, 59.5, 41.0), "mix=1": row(78.0, 57.0, 42.0)}
    # unguarded, every set counts in the mean and mix=1 wins ((77 + 45) / 2 at α 1)
    assert best_setting(rows)["model"] == "mix=1" and best_setting(rows)["mean_sentence_p1"] == 61.0
    assert guard_deficit(rows["mix=0.5"], "1.0", reference, ["nq"]) == 0.5
    assert guard_deficit(rows["mix=0.5"], "0.5", reference, ["nq"]) == 2.0  # sentence at α 0.5: 41 vs 43
    best = best_setting(rows, ["nq"], reference, tolerance=1.0)
    assert best == {"model": "mix=0.5", "alpha": 1.0, "mean_sentence_p1": 73.0, "guard_deficit": 0.5,
                    "guard": "admissible"}
    # exactly the tolerance below is admissible, whatever floating point makes of the rounded rows' difference
    assert 16.1 - 15.1 > 1.0 and guard_deficit(row(0.0, 15.1, 43.0), "1.0", row(0.0, 16.1, 40.0), ["nq"]) == 1.0
    edge = best_setting({"mix=1": row(78.0, 15.1, 43.0)}, ["nq"], row(0.0, 16.1, 40.0), tolerance=1.0)
    assert edge["guard"] == "admissible"
    # nothing admissible: the smallest worst deficit, said so
    strict = best_setting(rows, ["nq"], reference, tolerance=-5.0)
    assert strict["model"] == "mix=0" and strict["guard"].startswith("none admissible")


class OneDeviceMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Refuses every operation whose tensor arguments sit on more than one device (a 0-dim CPU
    tensor, which PyTorch itself lets meet any device, excepted) — what a GPU refuses. The meta
    device alone lets an index or a mask built on the CPU through, which is how the two CUDA bugs of
    ../shared/models/README.md passed its test."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = set()

        def visit(x):
            if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.dim() == 0):
                devices.add(x.device.type)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    visit(y)

        visit(args)
        visit(list((kwargs or {}).values()))
        if len(devices) > 1:
            raise RuntimeError(f"{func}: tensors on {sorted(devices)} in one operation")
        return func(*args, **(kwargs or {}))


def _meta_student(make_tiny_encoder):
    from transformers import BertModel

    encoder = make_tiny_encoder(doc_maxlen=64, query_maxlen=8).with_settings(
        markers={"Q": "[unused0]", "Q'": "[unused2]", "D": "[unused1]"}, span_query_marker="Q'")
    config = encoder.backbone.config
    config._attn_implementation = "eager"  # sdpa's attention-mask shortcut reads a value (.item())
    encoder.backbone = BertModel(config, add_pooling_layer=False)
    encoder.to("meta")
    return encoder


def test_the_mode_catches_a_cpu_index_on_another_device():
    x = torch.zeros(2, 6, device="meta")
    x.gather(1, torch.zeros(2, 3, dtype=torch.long))  # the meta device alone lets this through
    with pytest.raises(RuntimeError, match="in one operation"), OneDeviceMode():
        x.gather(1, torch.zeros(2, 3, dtype=torch.long))


def test_a_student_step_keeps_every_tensor_on_the_encoders_device(make_tiny_encoder):
    # No GPU here: the encoder on the meta device and every operation refused that mixes devices — one
    # whole step (forward, loss, backward through the marker-row hook, optimizer) of the in-batch,
    # multi-granular student with marker rows, as the GPU run made it.
    from agrame.training.student import trainable_parameters

    encoder = _meta_student(make_tiny_encoder)
    batch = [record("reefs", [0, 1, 2]), record("tower", [2, 3, 0])]
    params = trainable_parameters(encoder, layers=1)
    assert any(p is encoder.backbone.embeddings.word_embeddings.weight for p in params)  # the marker-row hook
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for in_batch in (False, True):
        scorer = StudentScorer(encoder, "Q'", in_batch=in_batch)
        assert scorer.device.type == "meta"
        with OneDeviceMode():
            value = make_loss(scorer, MultiGranularKLLoss())(batch)
            value.backward()
            optimizer.step()
            optimizer.zero_grad()
        assert value.device.type == "meta" and value.shape == ()


def test_a_batch_64_in_batch_step_keeps_every_tensor_on_one_device(make_tiny_encoder):
    # the device call's batch (training.bundle.DEVICE_BATCH): 64 questions × their passages, one in-batch
    # softmax over all 64 × 3 passages, under the mode that refuses mixed devices
    from training.bundle import DEVICE_BATCH
    from agrame.training.student import trainable_parameters

    encoder = _meta_student(make_tiny_encoder)
    batch = [record(q, order) for q, order in zip(("reefs", "tower", "corals", "paris") * 16,
                                                   ([0, 1, 2], [2, 3, 0], [1, 2, 3], [3, 0, 1]) * 16)]
    assert len(batch) == DEVICE_BATCH
    optimizer = torch.optim.AdamW(trainable_parameters(encoder, layers=1), lr=2.83e-4)
    scorer = StudentScorer(encoder, "Q'", in_batch=True)
    with OneDeviceMode():
        passage, _, _ = scorer(batch)
        value = make_loss(scorer, MultiGranularKLLoss())(batch)
        value.backward()
        optimizer.step()
    assert tuple(passage.shape) == (DEVICE_BATCH, DEVICE_BATCH * 3) and value.device.type == "meta"


def test_held_out_rows_resume_after_an_interruption(tmp_path):
    from agrame.training.choose_mix import fingerprint, measure_rows

    calls = []

    def row(name, fail=False):
        def run():
            calls.append(name)
            if fail:
                raise KeyboardInterrupt  # the session ends while this row is measured
            return {"x": {"passage_p1": float(len(name))}}
        return run

    partial, sig = tmp_path / "mix.json.partial", {"tuned": "a"}
    with pytest.raises(KeyboardInterrupt):
        measure_rows({"mix=0": row("mix=0"), "mix=1": row("mix=1", fail=True)}, partial, sig)
    assert calls == ["mix=0", "mix=1"] and partial.is_file()
    rows = measure_rows({"mix=0": row("mix=0"), "mix=1": row("mix=1"), "zero-shot": row("zero-shot")}, partial, sig)
    assert calls == ["mix=0", "mix=1", "mix=1", "zero-shot"]  # mix=0 was kept, not measured again
    assert list(rows) == ["mix=0", "mix=1", "zero-shot"] and rows["mix=0"] == {"x": {"passage_p1": 5.0}}
    calls.clear()  # another model (its signature): nothing kept
    measure_rows({"mix=0": row("mix=0")}, partial, {"tuned": "b"})
    assert calls == ["mix=0"]

    model = tmp_path / "final"
    model.mkdir()
    (model / "weights.safetensors").write_bytes(b"1")
    before = fingerprint(str(model))
    (model / "weights.safetensors").write_bytes(b"22")  # trained again
    assert fingerprint(str(model)) != before and fingerprint("zero-shot") == "zero-shot"
    before = fingerprint(str(model))
    os.utime(model / "weights.safetensors", ns=(1, 1))  # the same files copied afresh: the rows stay valid
    assert fingerprint(str(model)) == before


def test_choose_mix_writes_its_choice_and_drops_the_partial(tmp_path, tiny_model_dir, capsys):
    from agrame.training.choose_mix import main
    from training.data import write_jsonl

    r = record("bleach reefs warm water", [0, 1, 2])
    r["passages"][0]["answer_sentences"] = [0]
    held = tmp_path / "held.jsonl"
    write_jsonl([r, r, r], held)
    out = tmp_path / "mix.json"
    main(["--start", str(tiny_model_dir), "--tuned", str(tiny_model_dir), "--mix", "0", "1",
          "--held", f"a={held}:1:2", "--reference", str(tiny_model_dir), "--out", str(out)])
    result = json.loads(out.read_text())
    # measured (and kept) in this order: the reference, then the largest λ first
    assert result["held_out"] == {"a": 2} and list(result["rows"]) == [str(tiny_model_dir), "mix=1", "mix=0"]
    assert result["best"]["model"] in ("mix=0", "mix=1")
    assert result["rows"]["mix=1"] == result["rows"][str(tiny_model_dir)]  # λ = 1 is the tuned model itself
    assert not (tmp_path / "mix.json.partial").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["--start", "x", "--tuned", "y", "--held", f"a={tmp_path}/missing.jsonl", "--out", str(out)])
    assert exit_.value.code == 2 and "--held" in capsys.readouterr().err
    # a guard set is measured in every row and constrains against the reference (identical models here)
    main(["--start", str(tiny_model_dir), "--tuned", str(tiny_model_dir), "--mix", "0", "1",
          "--held", f"a={held}:1:2", "--guard", f"g={held}:0:1", "--reference", str(tiny_model_dir), "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["rows"]["mix=0"]) == {"a", "g"} and result["best"]["guard"] == "admissible"
    for bad, message in ((["--guard", f"g={held}"], "--guard needs --reference"),
                         (["--guard", f"a={held}", "--reference", "z"], "must differ")):
        with pytest.raises(SystemExit) as exit_:
            main(["--start", "x", "--tuned", "y", "--held", f"a={held}", *bad, "--out", str(out)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("buckets", [2, 3, 4])
def test_length_buckets_change_no_score_and_no_gradient(encoder, buckets):
    """Encoding passages in length groups is a speed-up only: same scores, same gradients as one padded batch."""
    t = (3.0, 0.0, -1.0, 1.0)
    batch = [record("why do reefs bleach", [0, 1, 2, 3], t), record("who built the tower", [2, 3, 0, 1], t),
             record("what is coral", [1, 0, 3, 2], t)]

    def run(b):
        torch.manual_seed(0)
        scorer = StudentScorer(encoder, "Q'", in_batch=True, buckets=b).eval()
        encoder.zero_grad()
        passage, sentence, mask = scorer(batch)
        (passage.sum() + (sentence * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        return passage.detach(), sentence.detach(), mask, grads

    one, many = run(1), run(buckets)
    assert torch.allclose(one[0], many[0], atol=1e-5) and torch.allclose(one[1], many[1], atol=1e-5)
    assert torch.equal(one[2], many[2])
    assert one[3].keys() == many[3].keys() and one[3]
    for name in one[3]:
        assert torch.allclose(one[3][name], many[3][name], atol=1e-4), name


def test_distill_records_are_bm25s_top_passages_unlabelled(tmp_path):
    from training.mined import distill_records, main as mined

    texts = ["Paris is the capital of France. It lies on the Seine.", "France borders Spain.",
             "The capital of Italy is Rome.", "Berlin is in Germany."]
    questions = [("q-0", "capital of france", ["Paris"]), ("q-1", "where is berlin", ["Germany"]),
                 ("q-2", "rome italy", ["Rome"])]
    out = list(distill_records(questions, texts, passages=3, limit=2))
    assert [r["qid"] for r in out] == ["q-0", "q-1"]
    assert out[0]["passages"][0]["text"] == texts[0] and out[1]["passages"][0]["text"] == texts[3]
    assert all(len(r["passages"]) == 3 and "positive" not in r["passages"][0] for r in out)
    assert out[0]["passages"][0]["sentences"] == [[0, 31], [32, 53]]
    with pytest.raises(SystemExit) as exit_:
        mined(["distill", "--topics", "nq-dev", "--exclude", str(tmp_path / "missing.jsonl"),
               "--out", str(tmp_path / "never.jsonl")])
    assert exit_.value.code == 2 and not (tmp_path / "never.jsonl").exists()


def test_claim_distillation_leaves_each_statements_own_lead_out():
    from training.mined import distill_records, lead_claims

    leads = ["Paris is the capital and largest city of France. Tiny.",
             "Short one. The Seine flows through Paris and into the English Channel at Le Havre.",
             "Too short to query."]
    corpus = ["Rome is in Italy.", "The capital of France is Paris, on the Seine.", *leads]
    claims, own = lead_claims(leads, seed=0, offset=2)
    assert sorted(claims) == [("wiki-claims-0", "Paris is the capital and largest city of France.", []),
                              ("wiki-claims-1", "The Seine flows through Paris and into the English Channel at "
                                                "Le Havre.", [])]
    assert own == {"wiki-claims-0": 2, "wiki-claims-1": 3}
    out = list(distill_records(claims, corpus, passages=3, limit=5, own=own))
    assert len(out) == 2
    for r in out:
        texts = [p["text"] for p in r["passages"]]
        assert len(texts) == 3 and corpus[own[r["qid"]]] not in texts
        assert texts[0] == corpus[1]  # the other text about Paris and the Seine ranks first once its own is gone
    # without ``own`` a statement finds its own lead first
    assert all(r["passages"][0]["text"] == corpus[own[r["qid"]]] for r in distill_records(claims, corpus, 3, 5))


def test_multivector_teacher_scores_are_the_students_own(encoder, tmp_path):
    """Self-distillation from the model training starts at: the teacher's logits are the student's
    scores at step 0 (passages with [Q], sentences with [Q'])."""
    from training.teachers import main as teachers

    encoder.save(tmp_path / "m")
    batch = [record("why do reefs bleach", [0, 1, 2]), record("who built the tower in 1889", [2, 3, 0])]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in batch))
    teachers(["multivector", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.jsonl"),
              "--out", str(tmp_path / "t.jsonl")])
    scored = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    with torch.no_grad():
        passage, sentence, mask = StudentScorer(encoder, "Q'").eval()(batch)
    for b, r in enumerate(scored):
        for p, item in enumerate(r["passages"]):
            assert item["teacher"] == pytest.approx(float(passage[b, p]), abs=1e-3)
            assert len(item["teacher_sentences"]) == len(item["sentences"])
            for j, value in enumerate(item["teacher_sentences"]):
                if mask[b, p, j]:
                    assert value == pytest.approx(float(sentence[b, p, j]), abs=1e-3)


def test_records_scored_in_a_batch_score_as_one_at_a_time(encoder):
    # the teacher encodes several records' passages and questions together (a GPU's few, larger passes)
    from agrame.ranker import Ranker
    from agrame.training.choose_mix import batch_record_scores, record_scores

    ranker = Ranker(encoder)
    batch = [record("why do reefs bleach", [0, 1, 2]), record("who built the tower in 1889", [2, 3]),
             record("corals and their algae", [1])]
    encoded = []  # each distinct passage text encoded once (records of one corpus share passages)
    encode = encoder.encode_passages
    with torch.no_grad():
        encoder.encode_passages = lambda texts, **kw: encoded.extend(texts) or encode(texts, **kw)
        try:
            together = list(batch_record_scores(ranker, batch, passages_per_pass=4))
        finally:
            del encoder.encode_passages
        assert sorted(encoded) == sorted({p["text"] for r in batch for p in r["passages"]})
        for r, got in zip(batch, together):
            alone = record_scores(ranker, r)
            for a, b in zip(got, alone):
                assert a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-5, equal_nan=True)


def test_choose_mix_reuses_a_reference_row_measured_on_the_same_sets(tiny_model_dir, tmp_path, monkeypatch):
    from agrame.training import choose_mix
    from agrame.training.choose_mix import main, reusable_rows
    from training.data import write_jsonl

    r = record("bleach reefs warm water", [0, 1, 2])
    r["passages"][0]["answer_sentences"] = [0]
    held = tmp_path / "held.jsonl"
    write_jsonl([r, r, r], held)
    calls = []
    real = choose_mix.evaluate
    monkeypatch.setattr(choose_mix, "evaluate", lambda model, records: calls.append(1) or real(model, records))
    common = ["--start", str(tiny_model_dir), "--tuned", str(tiny_model_dir), "--mix", "0", "1",
              "--held", f"a={held}:1:2", "--reference", str(tiny_model_dir)]
    first = tmp_path / "first.json"
    main([*common, "--out", str(first)])
    assert len(calls) == 3  # two mixes and the reference, one set each
    second = tmp_path / "second.json"
    main([*common, "--reuse", str(tmp_path / "missing.json"), "--reuse", str(first), "--out", str(second)])
    assert len(calls) == 5  # the reference row came from the first result
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert b["reused"] == {str(tiny_model_dir): str(first)} and a["reused"] == {}
    assert b["rows"][str(tiny_model_dir)] == a["rows"][str(tiny_model_dir)]
    # other sets (a different window), a rewritten file or another model: measured again
    main([*common[:-4], "--held", f"a={held}:0:2", "--reference", str(tiny_model_dir), "--reuse", str(first),
          "--out", str(tmp_path / "third.json")])
    assert len(calls) == 8
    sets = {k: a[k] for k in ("held_out_files", "guard_files", "held_out", "set_fingerprints")}
    assert reusable_rows(first, [str(tiny_model_dir)], sets)
    assert not reusable_rows(first, [str(tiny_model_dir)], {**sets, "set_fingerprints": {"x": "1:2"}})
    old = {k: v for k, v in a.items() if k not in ("reference_fingerprints", "set_fingerprints")}
    (tmp_path / "old.json").write_text(json.dumps({**old, "rows": {**a["rows"], "zero-shot": {"a": {}}}}))
    # a result from before fingerprints: a name is its own identity, a folder cannot be checked
    assert list(reusable_rows(tmp_path / "old.json", [str(tiny_model_dir), "zero-shot"], sets)) == ["zero-shot"]
