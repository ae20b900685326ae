"""Issue 42, item 4: `agrame qrels` writes the benchmarks' gold, so that a run + `agrame evaluate`
reproduce `benchmarks.open_domain`'s metrics (on a sample of the real datasets, tiny model)."""

from __future__ import annotations

import json

import pytest

from agrame.corpus import Passage
from agrame_app.cli import main


def _evaluate(run, qrels, capsys) -> dict:
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "P@1 Success@5",
                 "-f", "jsonl"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("dataset", ["squad-dev", "nq-oracle"])
def test_qrels_and_evaluate_reproduce_the_open_domain_benchmark(dataset, tmp_path, tiny_model_dir, capsys):
    from benchmarks import open_domain

    result = tmp_path / "result.json"
    open_domain.main(["--dataset", dataset, "--method", "colbert-zeroshot-psg", "--model", str(tiny_model_dir),
                      "--limit", "12", "--pool-limit", "60", "--runs", str(tmp_path / "runs"), "--out", str(result)])
    metrics = json.loads(result.read_text())["metrics"]
    for granularity, prefix in (("passage", "psg"), ("sentence", "sent")):
        qrels = tmp_path / f"{granularity}.qrels"
        # the same sample: --limit/--seed as the benchmark's; gold from the whole pool, ids the pool's
        assert main(["qrels", "--dataset", dataset, "-g", granularity, "--limit", "12", "-o", str(qrels)]) == 0
        capsys.readouterr()
        got = _evaluate(tmp_path / "runs" / f"{dataset}-{granularity}.trec", qrels, capsys)
        assert round(100 * got["P@1"], 2) == metrics[f"{prefix}_p1"], granularity
        assert round(100 * got["Success@5"], 2) == metrics[f"{prefix}_r5"], granularity


def test_answer_match_gold_equals_the_benchmarks_judgments(tmp_path, tiny_model_dir, capsys):
    """NQ-open: relevant = every passage / sentence holding a normalised answer; the qrels
    (over the same restricted pool) score the benchmark's run as it judged it, on the answerable questions."""
    from agrame.runs import read_run
    from agrame.evaluation import evaluate
    from benchmarks import open_domain
    from agrame.datasets import load_pool, load_questions, restrict_pool, sample
    from agrame.gold import qrels

    result = tmp_path / "result.json"
    open_domain.main(["--dataset", "nq-open", "--method", "colbert-zeroshot-psg", "--model",
                      str(tiny_model_dir), "--limit", "20", "--pool-limit", "150", "--runs", str(tmp_path / "runs"),
                      "--out", str(result)])
    answerable = json.loads(result.read_text())["metrics_answerable"]
    full = load_pool()
    questions = sample(load_questions("nq-open", full), 20, 0)
    pool, _ = restrict_pool(full, [], 150, 0)  # as the benchmark's --pool-limit (no gold passages to keep)
    for granularity, prefix in (("passage", "psg"), ("sentence", "sent")):
        table = qrels("nq-open", questions, pool, granularity)
        assert len(table) == 5  # the answerable questions of this sample
        run = read_run(tmp_path / "runs" / f"nq-open-{granularity}.trec")
        got = evaluate(run, table, ["P@1", "Success@5"])
        assert round(100 * got["P@1"], 2) == answerable[f"{prefix}_p1"], granularity
        assert round(100 * got["Success@5"], 2) == answerable[f"{prefix}_r5"], granularity


def test_qrels_take_the_index_own_sentence_spans(tmp_path, tiny_encoder, capsys):
    from agrame.index.writer import build_compressed
    from agrame.datasets import load_pool, load_questions, sample

    pool = load_pool()
    questions = sample(load_questions("squad-dev", pool), 3, 0)
    gold = sorted({q.gold_passage for q in questions})
    # an index that cut its passages into halves, not sentences: the qrels must name its halves
    halves = {p: ((0, len(pool.texts[p]) // 2), (len(pool.texts[p]) // 2, len(pool.texts[p]))) for p in gold}
    build_compressed(tiny_encoder, [Passage(pool.ids[p], pool.texts[p]) for p in gold], tmp_path / "ix",
                     sentences=[halves[p] for p in gold], progress=False)
    out = tmp_path / "q.qrels"
    assert main(["qrels", "--dataset", "squad-dev", "--limit", "3", "-i", str(tmp_path / "ix"), "-o", str(out),
                 "--queries-out", str(tmp_path / "q.tsv")]) == 0
    lines = [line.split() for line in out.read_text().splitlines()]
    assert sorted(line[0] for line in lines) == sorted(q.qid for q in questions)
    for q in questions:
        (doc,) = [line[2] for line in lines if line[0] == q.qid]
        half = 0 if q.answer_start < halves[q.gold_passage][0][1] else 1
        a, b = halves[q.gold_passage][half]
        assert doc == f"{pool.ids[q.gold_passage]}#{a}:{b}"
    queries = dict(line.split("\t") for line in (tmp_path / "q.tsv").read_text().splitlines())
    assert set(queries) == {q.qid for q in questions}
    # a passage the index lacks: exit 2, naming it
    capsys.readouterr()
    assert main(["qrels", "--dataset", "squad-dev", "--limit", "5", "--seed", "1", "-i", str(tmp_path / "ix"),
                 "-o", str(tmp_path / "other.qrels")]) == 2
    assert "no passage 'squad-dev-" in capsys.readouterr().err and not (tmp_path / "other.qrels").exists()


def test_qrels_refuse_missing_data_and_evaluate_warns_on_foreign_ids(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGRAME_DATA", str(tmp_path / "nowhere"))
    assert main(["qrels", "--dataset", "nq-oracle", "-o", str(tmp_path / "x.qrels")]) == 2
    assert "AGRAME_DATA" in capsys.readouterr().err and not (tmp_path / "x.qrels").exists()
    # a run of pool positions against qrels of source ids: every query would score 0 — say why
    qrels, run = tmp_path / "q.qrels", tmp_path / "r.trec"
    qrels.write_text("".join(f"q{i} 0 squad-dev-{i}-0 1\n" for i in range(12)))
    run.write_text("".join(f"q{i} Q0 {i} 1 1.0 t\n" for i in range(12)))
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "P@1"]) == 0
    assert "ranks no passage the qrels judge" in capsys.readouterr().err
    run.write_text("".join(f"x{i} Q0 squad-dev-{i}-0 1 1.0 t\n" for i in range(12)))
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "P@1"]) == 0
    assert "queries are in the qrels" in capsys.readouterr().err
