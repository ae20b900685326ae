"""Batch search, TREC run files, qrels and evaluation through the real ir_measures."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.index import Index, build_index
from agrame.index.batch import search_batch
from agrame.ranker import ScoredSpan
from agrame.runs import RunFileError, docid, parse_docid, read_qrels, read_queries, read_run, write_run
from agrame_app.cli import main

from test_lifecycle import _passages

QUERIES = ["coral bleaching", "tower in Paris", "who discovered radium", "glaciers and climate", "reef fish"]


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_encoder):
    path = tmp_path_factory.mktemp("runs") / "ix"
    build_index(tiny_encoder, _passages(30, meta=False), path)
    return Index(path, model=tiny_encoder)


def _hit(pid, pieces):
    a, b = pieces[0]
    return ScoredSpan(pid, a, b, 1.0, 0.5, 1.0, "", tuple(pieces) if len(pieces) > 1 else ())


@settings(max_examples=200, deadline=None)
@given(pid=st.text(min_size=1, max_size=20).filter(lambda t: "\x00" not in t),
       pieces=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 500)).map(lambda t: (t[0], t[0] + t[1])),
                       min_size=1, max_size=3))
def test_document_ids_round_trip_and_fit_a_trec_column(pid, pieces):
    for granularity in ("passage", "sentence"):
        text = docid(_hit(pid, pieces), granularity)
        assert text and not any(c.isspace() for c in text)
        back_pid, back_pieces = parse_docid(text)
        assert back_pid == pid
        assert back_pieces == (() if granularity == "passage" else tuple(pieces))


def test_batch_search_equals_one_query_at_a_time(index):
    queries = [(f"q{i}", t) for i, t in enumerate(QUERIES)]
    for granularity in ("passage", "sentence"):
        for batch_size in (1, 2, 32):
            got = dict(search_batch(index, queries, granularity, 7, batch_size=batch_size))
            for qid, text in queries:
                one = index.search(text, granularity, top_k=7)
                assert [(h.passage_id, h.start, h.end) for h in got[qid]] == \
                    [(h.passage_id, h.start, h.end) for h in one]
                assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(got[qid], one))
    with pytest.raises(ValueError, match="query 'x' is empty"):
        list(search_batch(index, [("x", "  ")], "passage"))


def test_run_file_round_trip(tmp_path, index):
    path = tmp_path / "run.trec"
    queries = [(f"q{i}", t) for i, t in enumerate(QUERIES)]
    with open(path, "w") as out:
        for qid, hits in search_batch(index, queries, "sentence", 5):
            write_run(out, qid, hits, "sentence", "tag1")
    lines = path.read_text().splitlines()
    assert len(lines) == 25 and lines[0].split()[1] == "Q0" and lines[0].split()[3] == "1"
    run = read_run(path)
    assert set(run) == {q for q, _ in queries} and all(len(d) == 5 for d in run.values())
    for doc in run["q0"]:
        pid, pieces = parse_docid(doc)
        assert index.get(pid) is not None and len(pieces) == 1


def test_ir_measures_agree_with_the_benchmarks_metrics():
    from agrame.evaluation import evaluate
    from benchmarks.metrics import mean, precision_at_1, recall_at_k

    rng = random.Random(0)
    run, qrels, judged = {}, {}, []
    for q in range(200):
        docs = [f"d{i}" for i in rng.sample(range(300), 120)]
        relevant = set(rng.sample(docs, rng.randint(0, 2))) | ({f"d{rng.randint(0, 299)}"} if q % 3 else set())
        run[f"q{q}"] = {d: 1000.0 - r for r, d in enumerate(docs)}  # distinct scores: one order
        qrels[f"q{q}"] = {d: 1 for d in relevant} or {"none": 0}
        judged.append([d in relevant for d in docs])
    ours = {"P@1": mean(precision_at_1(j) for j in judged), "Success@10": mean(recall_at_k(j, 10) for j in judged),
            "Success@100": mean(recall_at_k(j, 100) for j in judged)}
    theirs = evaluate(run, qrels, list(ours))
    assert ours == pytest.approx({k: 100 * v for k, v in theirs.items()}, abs=1e-9)


def test_cli_batch_search_to_a_run_and_evaluate(tmp_path, index, tiny_model_dir, capsys):
    # an index the CLI loads by its model folder
    ix = tmp_path / "ix"
    assert main(["index", "-p", str(_write_passages(tmp_path)), "-i", str(ix), "-m", str(tiny_model_dir)]) == 0
    queries = tmp_path / "q.tsv"
    queries.write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate(QUERIES)))
    run = tmp_path / "out.trec"
    assert main(["search", "-i", str(ix), "--queries", str(queries), "--run", str(run), "-g", "passage",
                 "-k", "20"]) == 0
    ranked = read_run(run)
    assert len(ranked) == 5
    top = {qid: max(docs, key=docs.get) for qid, docs in ranked.items()}
    # Evaluators order equal scores their own way (trec_eval by docid, descending), whatever the rank column
    # says, so the run's top must be alone at the top for its qrels to give P@1 = 1.
    assert all(sorted(docs.values())[-1] > sorted(docs.values())[-2] for docs in ranked.values())
    qrels = tmp_path / "q.qrels"
    qrels.write_text("".join(f"{qid} 0 {doc} 1\n" for qid, doc in top.items()))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "P@1 RR@10",
                 "-f", "jsonl"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["P@1"] == 1.0 and summary["RR@10"] == 1.0 and summary["queries"] == 5
    # JSONL output: one line per query, in the file's order
    jq = tmp_path / "q.jsonl"
    jq.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(QUERIES)))
    assert main(["search", "-i", str(ix), "--queries", str(jq), "-f", "jsonl", "-k", "3"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["qid"] for x in lines] == ["0", "1", "2", "3", "4"] and all(len(x["results"]) == 3 for x in lines)


def test_evaluate_refuses_a_run_of_another_granularity_and_warns_on_foreign_spans(tmp_path, capsys):
    from agrame.evaluation import check_granularity, span_mismatch

    passages = tmp_path / "run-p.trec"
    passages.write_text("".join(f"q{i} Q0 p{i} 1 2.0 x\nq{i} Q0 p{i + 1} 2 1.0 x\n" for i in range(12)))
    sentence_qrels = tmp_path / "s.qrels"
    sentence_qrels.write_text("".join(f"q{i} 0 p{i}#0:20 1\n" for i in range(12)))
    code = main(["evaluate", "--run", str(passages), "--qrels", str(sentence_qrels), "--measures", "P@1"])
    err = capsys.readouterr().err
    assert code == 2 and "the run ranks passages (e.g. 'p0')" in err and "qrels judge sentences (e.g. 'p0#0:20')" in err
    # sentences both sides, but the qrels' spans are another splitter's: a warning, and the numbers still come
    sentences = tmp_path / "run-s.trec"
    sentences.write_text("".join(f"q{i} Q0 p{i}#0:25 1 2.0 x\nq{i} Q0 p{i}#26:40 2 1.0 x\n" for i in range(12)))
    assert main(["evaluate", "--run", str(sentences), "--qrels", str(sentence_qrels), "--measures", "P@1"]) == 0
    assert "sentence qrels must name AGRaME's own sentence spans" in capsys.readouterr().err
    matching = tmp_path / "ok.qrels"
    matching.write_text("".join(f"q{i} 0 p{i}#0:25 1\n" for i in range(12)))
    assert main(["evaluate", "--run", str(sentences), "--qrels", str(matching), "--measures", "P@1"]) == 0
    assert "warning" not in capsys.readouterr().err
    # mixed qrels (passages and sentences) are not refused
    check_granularity({"q": {"p1": 1.0}}, {"q": {"p1": 1, "p1#0:3": 1}})
    assert span_mismatch({"q": {"p1#0:3": 1.0}}, {"q": {"p1#0:4": 1}}) is None  # too few to say


def _write_passages(tmp_path):
    # Six distinct texts: _passages(30)'s copies ("… Copy 17.") tie exactly with their original on some queries.
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in _passages(6, meta=False)))
    return path


@pytest.mark.parametrize("content, message", [
    ("q1\tcoral\nq2 no tab here\n", r"q.tsv:2: expected 'qid<TAB>query text'"),
    ("q1\tcoral\nq2\t   \n", r"q.tsv:2: query 'q2' is empty"),
    ("q1\tcoral\nq1\treef\n", r"q.tsv:2: query id 'q1' repeats line 1"),
    ("\tcoral\n", r"q.tsv:1: the query id is empty"),
])
def test_bad_query_files_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "q.tsv"
    path.write_text(content)
    with pytest.raises(RunFileError, match=message):
        read_queries(path)


def test_bad_jsonl_queries_and_run_lines(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"text": "no id"}\n')
    with pytest.raises(RunFileError, match=r"q.jsonl:2: field 'id' is missing"):
        read_queries(path)
    run = tmp_path / "r.trec"
    run.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 two 1.0 t\n")
    with pytest.raises(RunFileError, match=r"r.trec:2: rank 'two'"):
        read_run(run)
    qrels = tmp_path / "x.qrels"
    qrels.write_text("q1 0 d1\n")
    with pytest.raises(RunFileError, match=r"x.qrels:1: expected 4 columns"):
        read_qrels(qrels)


def test_cli_bad_input_exits_2_naming_the_problem(tmp_path, index, capsys):
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\tcoral\nmissing-tab\n")
    assert main(["search", "-i", str(index.path), "--queries", str(queries)]) == 2
    assert "q.tsv:2:" in capsys.readouterr().err
    assert main(["search", "-i", str(index.path)]) == 2
    assert "give one query text, or --queries FILE" in capsys.readouterr().err
    run, qrels = tmp_path / "r.trec", tmp_path / "q.qrels"
    run.write_text("q1 Q0 d1 1 2.0 t\n")
    qrels.write_text("q1 0 d1 1\n")
    assert main(["evaluate", "--run", str(run), "--qrels", str(qrels), "--measures", "nDCG@10 Bogus@3"]) == 2
    assert "unknown measure 'Bogus@3'" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*tmp*"))


def test_query_files_with_lone_surrogates_are_refused(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "bad \\ud800"}\n')
    with pytest.raises(RunFileError, match=r"q.jsonl:2: field 'text': not valid Unicode"):
        read_queries(path)
