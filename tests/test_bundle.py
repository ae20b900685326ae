"""training.bundle: pack here → run on "the device" (the CPU here, --device cpu) → unpack here, with a tiny
base model and records; the size limit; the base-fingerprint check; the recipe agreeing with scale.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training import bundle
from training.bundle import BundleError

from test_training import TEXTS, record

ROOT = Path(__file__).resolve().parent.parent
TINY_ARGS = ["--layers", "1", "--batch-size", "2", "--doc-maxlen", "128"]


def _base_folder(path: Path, make_tiny_encoder, seed: int = 0) -> Path:
    """A MiniLM-like folder (config, weights, tokenizer) of the tiny test BERT: what AGRAME_MINILM names."""
    encoder = make_tiny_encoder(dim=None, seed=seed)
    encoder.backbone.save_pretrained(path)
    encoder.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tiny_base(tmp_path, make_tiny_encoder, monkeypatch):
    base = _base_folder(tmp_path / "base", make_tiny_encoder)
    monkeypatch.setenv("AGRAME_MINILM", str(base))
    return base


def _mined_record(k: int, question: str, order):
    r = record(question, order)
    r["qid"], r["answer"] = f"q{k}", "no such answer"  # (a mined negative is checked for the answer)
    for p, i in zip(r["passages"], order):
        p["pid"] = f"train-{i}"
    return r


def _records(tmp_path: Path):
    train = tmp_path / "train.jsonl"
    questions = ["why do reefs bleach", "who built the tower in 1889", "what do corals eat", "where is paris"]
    train.write_text("".join(json.dumps(_mined_record(2 * k + j, q, order)) + "\n"
                             for k, q in enumerate(questions) for j, order in enumerate(([0, 1, 2], [2, 3, 0]))))
    distill = tmp_path / "distill.jsonl"
    rows = []
    for q in ("reef colours", "a tall iron tower"):
        r = record(q, [1, 2, 3])
        for p in r["passages"]:  # unscored: the teacher scores them there
            p.pop("teacher"), p.pop("teacher_sentences")
        rows.append(json.dumps(r) + "\n")
    distill.write_text("".join(rows))
    return train, distill


def _scores(encoder, texts, query="why do corals bleach"):
    from agrame.ranker import Ranker

    ranker = Ranker(encoder)
    return torch.tensor([h.score for h in ranker.rank(query, ranker.encode(texts), "sentence", top_k=None)])


def test_pack_run_unpack_equals_a_model_trained_here(tmp_path, tiny_base):
    train, distill = _records(tmp_path)
    packed = tmp_path / "bundle"
    manifest = bundle.pack(packed, train=[f"{train}@2"], distill=[str(distill)], models=["agrame", "colbert"],
                           precision="float32", wheels="none", extra_args=TINY_ARGS, mine=("train.jsonl", "zero-shot"),
                           say=lambda *_: None)
    assert (packed / "run.sh").is_file() and (packed / "code" / "training" / "bundle.py").is_file()
    assert (packed / "code" / "benchmarks" / "metrics.py").is_file()  # (the remix's answer check)
    assert not (packed / "code" / "agrame" / "models").exists() and manifest["sizes"]["wheels"] == 0
    # the device machine: a bare folder, the bundle's own code, the CPU as the device
    out, work = tmp_path / "OUT", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGRAME_MINILM")}
    # one call: the scan beside the teacher, then 1 of each question's 2 negatives from its ranking
    done = subprocess.run(["bash", str(packed / "run.sh"), "--out", str(out), "--work", str(work), "--device", "cpu",
                           "--steps", "3", "--threads", "1", "--mined", "1"], cwd=tmp_path,
                          env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "run.json").read_text())
    assert set(report["students"]) == {"agrame", "colbert"}
    assert all(s["steps"] == 3 and s["question_steps"] == 3 * 2 for s in report["students"].values())
    assert not list(work.glob("big/*/checkpoint.pt"))  # a device call writes no checkpoints: none resumes
    assert all(Path(out / f).stat().st_size <= bundle.FILE_LIMIT for s in report["students"].values()
               for f in s["files"])
    unpacked = bundle.unpack(out, tmp_path / "models", say=lambda *_: None)
    assert set(unpacked) == {"agrame", "colbert"}
    # the mining scan ran there: each question's ranking of every passage the records hold
    rankings = [json.loads(x) for x in (tmp_path / "models" / "squad-ranking.jsonl").read_text().splitlines()]
    assert [r["qid"] for r in rankings] == [f"q{k}" for k in range(8)]
    assert all(sorted(r["ranked"]) == [0, 1, 2, 3] for r in rankings)
    assert report["mining"]["exit"] == 0 and not report["mining"]["stopped_at_deadline"]
    assert report["mining"]["records"] == 8 and not list(out.glob("*.partial"))
    # the students' records there are the packed ones remixed with that ranking, as here
    from training.data import read, write_jsonl
    from training.mined import read_ranking, remix_records

    remixed = tmp_path / "train-mined1.jsonl"
    write_jsonl(remix_records(read(train), read_ranking(tmp_path / "models" / "squad-ranking.jsonl"), 1), remixed)
    assert read(remixed) == read(work / "data" / "train-mined1.jsonl")
    assert read(remixed) != read(train)
    # here, with the same seed, data (the teacher's scores made here too) and recipe
    scored = tmp_path / "distill-scored.jsonl"
    local_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "training.teachers", "multivector", "--model", "zero-shot", "--data",
                    str(distill), "--out", str(scored)], check=True, cwd=ROOT, env=local_env, capture_output=True)
    assert scored.read_text() == (work / "data" / "distill-scored.jsonl").read_text()
    from agrame.loading import load_encoder

    texts = list(TEXTS)
    for name in ("agrame", "colbert"):
        start, args = bundle.MODELS[name]
        subprocess.run([sys.executable, "-m", "training.student", "--init-model", start, *args, *bundle.RECIPE,
                        *TINY_ARGS, "--device", "cpu", "--data", f"{remixed}@2", f"{scored}@1", "--steps", "3",
                        "--out", str(tmp_path / "local" / name)], check=True, cwd=ROOT, env=local_env,
                       capture_output=True)
        here = load_encoder(str(tmp_path / "local" / name / "final"))
        there = load_encoder(str(tmp_path / "models" / name))
        assert here.fingerprint() == there.fingerprint()  # the same weights and settings, exactly
        assert torch.equal(_scores(here, texts), _scores(there, texts))
        assert load_encoder(str(unpacked[name])).settings == here.settings  # the exported delta loads
        assert "done at step 3" in (tmp_path / "models" / name / "train.log").read_text()


def test_pack_from_a_runs_folder_takes_distill_records_scored_here_as_training_records(tmp_path, tiny_base):
    # scored here, they need no teacher stage there (the device call's slowest so far)
    train, distill = _records(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("squad-labels", "scifact-labels", "distill-nq-dev-scored"):
        (runs / f"{name}.jsonl").write_text(train.read_text())
    for t in ("nq-dev", "trivia-dev", "wiki-claims"):
        (runs / f"distill-{t}.jsonl").write_text(distill.read_text())
    bundle.main(["pack", str(tmp_path / "b"), "--runs", str(runs), "--wheels", "none", "--limit-mib", "60",
                 "--precision", "float32", "--mine", "none", "none", "--ranking", "none", "none",
                 "--models", "agrame", "colbert"])
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert manifest["train"] == [["squad-labels.jsonl", 1], ["scifact-labels.jsonl", 4],
                                 ["distill-nq-dev-scored.jsonl", 1]]
    assert manifest["distill"] == [["distill-trivia-dev.jsonl", 1], ["distill-wiki-claims.jsonl", 1]]


def test_a_mine_only_call_brings_the_ranking_back_alone(tmp_path, tiny_base):
    # the next device session's first call: the scan alone, so that the mined negatives are made here
    # before the bundle the second call trains from is packed
    train, distill = _records(tmp_path)
    packed = tmp_path / "bundle"
    bundle.pack(packed, train=[str(train)], distill=[str(distill)], models=["agrame"], precision="float32",
                wheels="none", extra_args=TINY_ARGS, mine=("train.jsonl", "zero-shot"), say=lambda *_: None)
    out, work = tmp_path / "OUT", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGRAME_MINILM")}
    done = subprocess.run(["bash", str(packed / "run.sh"), "--out", str(out), "--work", str(work), "--device", "cpu",
                           "--threads", "1", "--mine-only"], cwd=tmp_path, env={**env, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert sorted(f.name for f in out.iterdir()) == ["run.json", "squad-ranking.jsonl"]  # no teacher, no students
    assert not (work / "data" / "distill-scored.jsonl").exists()
    assert bundle.unpack(out, tmp_path / "models", say=lambda *_: None) == {}
    ranked = (tmp_path / "models" / "squad-ranking.jsonl").read_text().splitlines()
    assert [json.loads(x)["qid"] for x in ranked] == [f"q{k}" for k in range(8)]
    (out / "squad-ranking.jsonl").unlink()
    with pytest.raises(BundleError, match="no student files"):
        bundle.unpack(out, tmp_path / "none", say=lambda *_: None)


def test_a_float16_result_is_close_and_unpack_refuses_another_base(tmp_path, tiny_base, make_tiny_encoder,
                                                                    monkeypatch):
    train, _ = _records(tmp_path)
    manifest = bundle.pack(tmp_path / "b16", train=[str(train)], distill=[], models=["agrame"], precision="float16",
                           wheels="none", extra_args=TINY_ARGS, say=lambda *_: None)
    work, out = tmp_path / "work", tmp_path / "OUT"
    bundle.setup(tmp_path / "b16", work)
    monkeypatch.setenv("AGRAME_MINILM", str(tiny_base))  # (setup pointed it at the rounded θ₀)
    # θ₀ there is the float16 rounding of the true base
    from agrame.backbones import load_backbone

    true_state = load_backbone(tiny_base)[0].state_dict()
    rounded_state = load_backbone(work / "base")[0].state_dict()
    w = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(rounded_state[w], true_state[w].half().float())
    # a student trained there (a stand-in: the true base's own weights moved a little) comes back within
    # float16's rounding of the change, and its marker rows exactly
    final = tmp_path / "run" / "final"
    from agrame.training.student import student_encoder

    s = student_encoder(None, False, 128, None)
    with torch.no_grad():
        for name, p in s.backbone.named_parameters():
            p.copy_(rounded_state[name] + (0.01 * torch.randn_like(p) if "layer.1." in name else 0))
        s.backbone.embeddings.word_embeddings.weight[1] += 0.5  # one marker row
    s.save(final)
    (tmp_path / "run" / "train.log").write_text("2026-11-26 00:00:00,000 step 10 loss 1.0 lr 1e-4\n")
    files = bundle.pack_student(tmp_path / "run", work / "base", out, "agrame", manifest)
    assert files == ["agrame-0.safetensors"]
    rebuilt = bundle.unpack(out, tmp_path / "models", export=False, say=lambda *_: None)["agrame"]
    got = load_backbone(rebuilt)[0].state_dict()
    moved = "encoder.layer.1.attention.self.query.weight"
    change = s.backbone.state_dict()[moved] - rounded_state[moved]
    assert torch.allclose(got[moved] - true_state[moved], change, atol=1e-4)
    row = "embeddings.word_embeddings.weight"
    assert torch.equal(got[row][1], s.backbone.state_dict()[row][1])
    assert torch.equal(got["encoder.layer.0.output.dense.weight"], true_state["encoder.layer.0.output.dense.weight"])
    # another MiniLM here: refused, nothing rebuilt
    other = _base_folder(tmp_path / "other-base", make_tiny_encoder, seed=1)
    monkeypatch.setenv("AGRAME_MINILM", str(other))
    with pytest.raises(BundleError, match="trained over base .* but the local zero-shot model is"):
        bundle.unpack(out, tmp_path / "models2", say=lambda *_: None)
    assert not (tmp_path / "models2").exists()


def test_a_bundle_over_its_limit_is_refused_before_anything_is_written(tmp_path, tiny_base):
    train, _ = _records(tmp_path)
    with pytest.raises(BundleError, match=r"over its limit of 0.01 MiB \(data .* MiB, code .* MiB, base .* MiB"):
        bundle.pack(tmp_path / "b", train=[str(train)], distill=[], models=["agrame"], wheels="none",
                    limit_mib=0.01, say=lambda *_: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "distill.jsonl", "train.jsonl"]
    with pytest.raises(BundleError, match="already exists"):
        bundle.pack(tmp_path / "base", train=[str(train)], distill=[], wheels="none", say=lambda *_: None)


def test_records_round_trip_with_each_text_once(tmp_path):
    train, distill = _records(tmp_path)
    texts, slim = bundle.pack_records({"train.jsonl": train, "distill.jsonl": distill})
    (tmp_path / "texts.xz").write_bytes(texts)
    for name, path in (("train.jsonl", train), ("distill.jsonl", distill)):
        (tmp_path / f"{name}.xz").write_bytes(slim[name])
        bundle.unpack_records(tmp_path / "texts.xz", tmp_path / f"{name}.xz", tmp_path / f"back-{name}")
        assert [json.loads(x) for x in (tmp_path / f"back-{name}").read_text().splitlines()] == \
               [json.loads(x) for x in path.read_text().splitlines()]
    import lzma

    assert len(lzma.decompress(texts).decode().splitlines()) == 4  # the four distinct passages


def test_step_timing_from_a_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("2026-11-26 04:22:04,586 step 10 loss 1.3 lr 1e-05\n"
                   "2026-11-26 04:22:06,586 step 20 loss 1.3 lr 2e-05\n"
                   "2026-11-26 04:22:08,586 step 30 loss 1.2 lr 3e-05\n")
    assert bundle.seconds_per_step(log) == pytest.approx(0.2)
    log.write_text("2026-11-26 04:22:04,586 step 10 loss 1.3 lr 1e-05\n")
    with pytest.raises(BundleError, match="fewer than two"):
        bundle.seconds_per_step(log)


def test_the_bundle_recipe_is_scale_sh_s(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("START", "DIM", "ONLY", "STEPS", "DISTILL", "M")}
    out = subprocess.run(["bash", str(ROOT / "training" / "scale.sh")], env={**env, "RUN": "echo",
                         "AGRAME_RUNS": str(tmp_path)}, capture_output=True, text=True, timeout=60).stdout
    students = [line.split() for line in out.splitlines() if "training.student" in line]
    for line in students:
        flags = dict(zip(line, line[1:]))
        for flag, value in zip(bundle.RECIPE, bundle.RECIPE[1:]):
            if flag.startswith("--") and not value.startswith("--"):
                assert flags.get(flag) == value, (flag, line)
        assert "--in-batch" in line
    agrame, colbert = students
    assert "--sentence-marker" in agrame and agrame[agrame.index("--sentence-marker") + 1] == "Q'"
    assert colbert[colbert.index("--sentence-weight") + 1] == "0"


def test_state_encoding_round_trips_every_dtype():
    state = {"w": torch.randn(7, 5).half(), "b": torch.randn(3).half(), "idx": torch.arange(6), "f": torch.randn(2, 2),
             "s": torch.tensor(1.5, dtype=torch.float16)}
    back = bundle.decode_state(bundle.encode_state(state))
    assert set(back) == set(state)
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in state.items())


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_remixed_negatives_are_those_the_recipe_would_have_chosen(data):
    # a record of BM25-only negatives, remixed with a ranking, is the record squad_records writes with it
    from training.mined import choose_negatives, remix_records

    n = data.draw(st.integers(4, 14), label="paragraphs")
    answered = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="has the answer")
    texts = [f"paragraph {i}" + (" about zebras" if answered[i] else "") for i in range(n)]
    gold = data.draw(st.integers(0, n - 1), label="gold")
    bm25 = data.draw(st.permutations(range(n)), label="bm25")
    model = data.draw(st.permutations(range(n)), label="model")[:data.draw(st.integers(0, n), label="depth")]
    k = data.draw(st.integers(1, 5), label="negatives")
    mined = data.draw(st.integers(0, 6), label="mined")
    own = choose_negatives(gold, "zebras", [], bm25, texts, k, 0)
    if own is None:
        return

    def passage(i, positive):
        return {"pid": f"train-{i}", "text": texts[i], "sentences": [[0, len(texts[i])]], "positive": positive,
                "answer_sentences": [0] if positive else [], "teacher": 3.0 if positive else 0.0,
                "teacher_sentences": [3.0 if positive else 0.0]}

    record = {"qid": "q", "question": "where do zebras live", "answer": "zebras",
              "passages": [passage(gold, True)] + [passage(d, False) for d in own]}
    every = {"qid": "all", "question": "x", "answer": "x", "passages": [passage(i, False) for i in range(n)]}
    skipped = {"qid": "s", "question": "y", "answer": "y", "skipped": True}
    got = list(remix_records([record, every, skipped], {"q": model, "s": model}, mined))
    assert got[1] is every and got[2] is skipped  # (no ranking, no passages: kept)
    want = choose_negatives(gold, "zebras", model, bm25, texts, k, mined)
    assert [p["pid"] for p in got[0]["passages"]] == [f"train-{d}" for d in [gold] + want]
    assert got[0]["passages"][0] is record["passages"][0] and all(
        p["teacher"] == 0.0 and p["teacher_sentences"] == [0.0] and not p["positive"] for p in got[0]["passages"][1:])


def test_bad_remix_input_is_refused_or_reported(tmp_path, capsys):
    from training.mined import remix_records

    with pytest.raises(SystemExit) as exit_:
        bundle.main(["run", "--bundle", str(tmp_path), "--out", str(tmp_path / "o"), "--mined", "-1"])
    assert exit_.value.code == 2 and "--mined -1" in capsys.readouterr().err
    record = {"qid": "q", "question": "x", "passages": [{"pid": "train-0", "text": "a", "sentences": [[0, 1]]},
                                                        {"pid": "train-1", "text": "b", "sentences": [[0, 1]]}]}
    with pytest.raises(ValueError, match="record q: no answer"):
        list(remix_records([record], {"q": [1, 0]}, 1))
    # there, the call trains on the records as packed and says why
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "logs" / "mine").mkdir(parents=True)
    (work / "logs" / "mine" / "mine.log").write_text("ranked 1 questions")
    (work / "data").mkdir()
    (work / "data" / "train.jsonl").write_text(json.dumps(record) + "\n")
    out.mkdir()
    (out / "squad-ranking.jsonl").write_text(json.dumps({"qid": "q", "ranked": [1, 0]}) + "\n")
    done = bundle._start({"mine": ["-c", "pass"]}, work / "logs" / "done", dict(os.environ))
    data = [f"{work / 'data' / 'train.jsonl'}@2"]
    got, report = bundle._remix(done, {"records": "train.jsonl"}, 1, data, work, out, time.time() + 60)
    assert got == data and report["records"] == 0 and "no answer" in report["error"]
    assert not (work / "data" / "train-mined1.jsonl").exists()


def test_the_exact_mining_scan_ranks_as_the_ranker_does(make_tiny_encoder):
    from agrame.ranker import Ranker
    from training.mined import Miner, choose_negatives, exact_rankings

    encoder = make_tiny_encoder(dim=16)
    records = [_mined_record(k, q, order) for k, (q, order) in enumerate(
        [("why do reefs bleach", [0, 1, 2]), ("the tower of 1889", [3, 0]), ("corals and algae", [2, 3])])]
    got = dict(exact_rankings(encoder, records, depth=10, passages_per_chunk=2, questions_per_batch=2))
    ranker = Ranker(encoder)
    corpus = ranker.encode([(f"train-{i}", TEXTS[i]) for i in range(4)])
    for r in records:
        expected = [int(h.passage_id.split("-")[1]) for h in ranker.rank(r["question"], corpus, "passage", top_k=None)]
        assert got[r["qid"]] == expected
    # a ranking made elsewhere is the model's side of the mined negatives
    miner = Miner(list(TEXTS), None, None, depth=3, ranking={"q0": [2, 1, 0]})
    by_model, by_bm25 = miner.ranked(["why do reefs bleach"], ["q0"])
    assert by_model == [[2, 1, 0]] and len(by_bm25[0]) == 3
    assert choose_negatives(0, "zzz", by_model[0], [3, 1], TEXTS, 2, 1)[0] == 2


def test_the_refusal_names_the_shipped_models_a_device_call_need_not_send(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    for rel, size in (("agrame/models/zero-shot-128/projection.safetensors", 300),  # a start: stays
                      ("agrame/models/big/delta.safetensors", 4000), ("agrame/models/big/delta.json", 96),
                      ("training/results/call/kept/delta.safetensors", 2000), ("training/results/call/run.json", 9),
                      ("agrame/encoder.py", 50)):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(b"x" * size)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    # (and a student's weights kept beside its call's results)
    assert bundle.unneeded_shipped_models(repo) == {"big": 4096, "training/results/call/kept": 2000}
    hint = bundle.slim_checkout_hint(1000, repo)
    assert "git rm -rq agrame/models/big training/results/call/kept &&" in hint and "zero-shot-128" not in hint
    assert bundle.slim_checkout_hint(7000, repo) == ""  # leaving them out would not make room


def test_a_checkout_without_the_unneeded_shipped_models_leaves_room_for_the_real_bundle():
    # The last real bundle (README, issue 39) was 51.2 MiB; the shipped trained models travel with the
    # checkout, so without them the device call must still have that much room.
    slim = bundle.travelling_bytes() - sum(bundle.unneeded_shipped_models().values())
    assert bundle.LIMIT_MIB - slim / 2 ** 20 >= 51.2


def test_a_stage_past_its_deadline_is_stopped_and_named(tmp_path):
    import time

    started = time.time()
    with pytest.raises(BundleError, match="slow still running"):
        bundle._side_by_side({"slow": ["-c", "import time; time.sleep(60)"], "quick": ["-c", "pass"]},
                             tmp_path / "logs", dict(os.environ), deadline=time.time() + 1)
    assert time.time() - started < 30
    codes, late = bundle._wait(bundle._start({"quick": ["-c", "pass"]}, tmp_path / "logs", dict(os.environ)),
                               deadline=time.time() + 30)
    assert codes == {"quick": 0} and late == []


def test_a_failed_run_leaves_no_process_and_no_partial_ranking(tmp_path, monkeypatch):
    # the mining scan runs beside the stages: when one fails, run() stops it and drops its partial file
    out = tmp_path / "OUT"
    out.mkdir()
    started = {}

    def failing(bundle_, out_, work, **kwargs):
        started["p"] = bundle._start({"mine": ["-c", "import time; time.sleep(60)"]}, work / "logs", dict(os.environ))
        (out_ / "squad-ranking.jsonl.partial").write_text("{}\n")
        raise BundleError("teacher scoring failed")

    monkeypatch.setattr(bundle, "_run", failing)
    with pytest.raises(BundleError):
        bundle.run(tmp_path / "b", out, tmp_path / "work")
    assert started["p"]["mine"].poll() is not None and not list(out.iterdir())


def test_each_process_side_by_side_gets_its_share_of_the_cores(tmp_path):
    show = ["-c", "import os; print(os.environ['OMP_NUM_THREADS'])"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    bundle._wait(bundle._start({"a": show, "b": show}, tmp_path / "shared", env))
    share = str(max(1, (os.cpu_count() or 1) // 2))
    assert [(tmp_path / "shared" / f"{n}.log").read_text().strip() for n in "ab"] == [share, share]
    bundle._wait(bundle._start({"a": show}, tmp_path / "fixed", {**env, "OMP_NUM_THREADS": "3"}))
    assert (tmp_path / "fixed" / "a.log").read_text().strip() == "3"  # a caller's --threads wins


def test_the_carried_wheels_satisfy_the_carried_transformers_pins():
    # The machine's own huggingface-hub (1.x) failed transformers 4.48's import-time check on the first
    # device call: every package that check names and the bundle carries must be in its range.
    from packaging.specifiers import SpecifierSet
    from transformers.dependency_versions_table import deps

    pins = dict(w.split("==") for w in bundle.WHEELS)
    assert "huggingface-hub" in pins
    # every transformers < 4.58 (the project's range; the table read is the installed one's) asks
    # huggingface-hub < 1.0 and a floor at or below the carried pin
    assert pins["huggingface-hub"] in SpecifierSet(deps["huggingface-hub"][len("huggingface-hub"):])


def test_students_with_their_own_pool_factors_train_side_by_side_until_the_deadline(tmp_path, tiny_base):
    """Issue 61's call: the ranking remixed at pack time (no scan there), the student and its pooling-aware twin
    (``-pool2``) side by side at --batch-size 4 with the square-root learning rate, each training until the one
    deadline (its own number of steps, the schedule on the time), the call ending within its budget with little
    left; pack → run → unpack on the CPU."""
    from training.data import read, write_jsonl
    from training.mined import read_ranking, remix_records

    train, distill = _records(tmp_path)
    ranking = tmp_path / "ranking.jsonl"
    ranking.write_text("".join(json.dumps({"qid": f"q{k}", "ranked": [3, 2, 1, 0]}) + "\n" for k in range(8)))
    packed = tmp_path / "bundle"
    manifest = bundle.pack(packed, train=[str(train)], distill=[str(distill)], models=["agrame", "agrame-pool2"],
                           precision="float32", wheels="none", extra_args=TINY_ARGS, ranking=("train.jsonl", ranking),
                           mined=1, say=lambda *_: None)
    assert manifest["mine"] is None and manifest["models"]["agrame-pool2"]["args"][-2:] == ["--pool-factor", "2"]
    assert manifest["mined_from"] == {"records": "train.jsonl", "ranking": "ranking.jsonl", "mined": 1, "questions": 8}
    out, work = tmp_path / "OUT", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AGRAME_MINILM")}
    budget = 75  # (two students' imports and loading take ~20 s of it on two loaded cores)
    began = time.time()
    done = subprocess.run(["bash", str(packed / "run.sh"), "--out", str(out), "--work", str(work), "--device", "cpu",
                           "--threads", "1", "--batch-size", "4", "--budget", str(budget)], cwd=tmp_path,
                          env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "run.json").read_text())
    # the records there are the packed ones remixed here: exactly what remix_records makes of them
    remixed = tmp_path / "remixed.jsonl"
    write_jsonl(remix_records(read(train), read_ranking(ranking), 1), remixed)
    assert read(work / "data" / "train.jsonl") == read(remixed) != read(train)
    assert "mining" not in report and not (out / "squad-ranking.jsonl").exists()
    assert report["models"] == ["agrame", "agrame-pool2"] and set(report["students"]) == {"agrame", "agrame-pool2"}
    assert report["batch_size"] == 4 and report["lr"] == pytest.approx(1e-4 * 2 ** 0.5, rel=1e-2)
    for name, student in report["students"].items():
        assert student["steps"] >= 10 and student["training_s"] > 10 and report["question_steps"][name] == student["question_steps"] == 4 * student["steps"]
    assert report["students"]["agrame-pool2"]["pool_factor"] == 2 and "pool_factor" not in manifest["recipe"]
    assert 0 <= report["unused_s"] <= 15 and time.time() - began < budget + 30  # the budget used, and kept
    for name in ("agrame", "agrame-pool2"):
        settings = json.loads((work / "big" / name / "final" / "training.json").read_text())
        assert settings["batch_size"] == 4 and settings["lr"] == pytest.approx(report["lr"])
        assert settings["deadline"] == pytest.approx(began + budget, abs=15) and settings["checkpoint_every"] == 0
        lrs = [float(x.split(" lr ")[1].split()[0]) for x in (work / "big" / name / "train.log").read_text().splitlines()
               if " lr " in x]
        assert len(lrs) >= 2 and lrs[-1] < max(lrs) <= report["lr"]  # decaying towards the deadline
    assert set(bundle.unpack(out, tmp_path / "models", say=lambda *_: None)) == {"agrame", "agrame-pool2"}


def test_the_device_batch_and_its_learning_rate():
    assert bundle.DEVICE_BATCH == 64 and bundle.scaled_lr(bundle.RECIPE, 64) == pytest.approx(2.83e-4)
    assert bundle.scaled_lr(bundle.RECIPE, 8) == 1e-4 and bundle.recipe_value(bundle.RECIPE + ["--lr", "3e-4"], "--lr") == "3e-4"


def test_the_committed_ranking_is_refused_for_records_it_does_not_rank(tmp_path, tiny_base):
    train, distill = _records(tmp_path)
    with pytest.raises(BundleError, match="none of train.jsonl's 8 questions is ranked"):
        bundle.pack(tmp_path / "b", train=[str(train)], distill=[], models=["agrame"], precision="float32",
                    wheels="none", ranking=("train.jsonl", bundle.RANKING), say=lambda *_: None)
    assert not (tmp_path / "b").exists()
    with pytest.raises(BundleError, match="not both"):
        bundle.pack(tmp_path / "b", train=[str(train)], distill=[], models=["agrame"], precision="float32",
                    wheels="none", ranking=("train.jsonl", bundle.RANKING), mine=("train.jsonl", "zero-shot"),
                    say=lambda *_: None)
    ranked = bundle.RANKING
    assert ranked.is_file() and ranked.stat().st_size < 2 * 2 ** 20  # 23,989 questions, 30 paragraphs each


def test_pack_from_a_runs_folder_remixes_with_the_committed_ranking_by_default(tmp_path, tiny_base, capsys):
    # without --ranking or --mine, --runs means the committed ranking: records it does not rank are refused (exit 2)
    train, distill = _records(tmp_path)
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("squad-labels", "scifact-labels"):
        (runs / f"{name}.jsonl").write_text(train.read_text())
    for t in ("nq-dev", "trivia-dev", "wiki-claims"):
        (runs / f"distill-{t}.jsonl").write_text(distill.read_text())
    with pytest.raises(SystemExit) as stop:
        bundle.main(["pack", str(tmp_path / "b"), "--runs", str(runs), "--wheels", "none", "--limit-mib", "60",
                     "--precision", "float32", "--models", "agrame"])
    assert stop.value.code == 2 and not (tmp_path / "b").exists()
    err = capsys.readouterr().err
    assert "squad-ranking-zero-shot-128.jsonl" in err and "none of squad-labels.jsonl's 8 questions is ranked" in err


def test_a_pooling_aware_bundle_trains_its_students_for_the_pooled_index(tmp_path, tiny_base):
    train, distill = _records(tmp_path)
    with pytest.raises(bundle.BundleError, match="pool factor must be a number"):
        bundle.pack(tmp_path / "bad", train=[str(train)], distill=[], models=["agrame"], precision="float32",
                    wheels="none", extra_args=TINY_ARGS, pool_factor="0", say=lambda *_: None)
    assert not (tmp_path / "bad").exists()
    manifest = bundle.pack(tmp_path / "b", train=[str(train)], distill=[], models=["agrame"], precision="float32",
                           wheels="none", extra_args=TINY_ARGS, pool_factor="2", say=lambda *_: None)
    assert manifest["recipe"][-2:] == ["--pool-factor", "2"]
    # the student the bundle's recipe runs there, here on the CPU: it pools its passages as the index will
    start, args = bundle.MODELS["agrame"]
    done = subprocess.run([sys.executable, "-m", "training.student", "--init-model", start, *args,
                           *manifest["recipe"], "--device", "cpu", "--data", str(train), "--steps", "2",
                           "--out", str(tmp_path / "run")], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "final" / "training.json").read_text())["pool_factor"] == 2
    assert "done at step 2" in (tmp_path / "run" / "train.log").read_text()
