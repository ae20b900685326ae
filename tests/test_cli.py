"""`agrame` end to end on the tiny model: outputs, index/search, exit codes."""

from __future__ import annotations

import io
import json
import sys

import pytest

from agrame_app.cli import main


def run(argv, capsys, stdin: bytes | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_rank_sentence_jsonl(capsys, coral_file, tiny_model_dir):
    code, out, _ = run(["rank", "-g", "sentence", "-q", "What causes coral bleaching?", "-p", coral_file,
                        "-m", tiny_model_dir, "-f", "jsonl", "-k", "3"], capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["score"] >= rows[1]["score"] >= rows[2]["score"]
    texts = {json.loads(line)["id"]: json.loads(line)["text"] for line in coral_file.read_text().splitlines()}
    for r in rows:
        assert texts[r["passage_id"]][r["start"]:r["end"]] == r["text"]


def test_rank_table_and_passage_granularity(capsys, coral_file, tiny_model_dir):
    code, out, _ = run(["rank", "-g", "passage", "-q", "reef", "-p", coral_file, "-m", tiny_model_dir], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["#", "score", "passage", "chars"]
    assert len(lines) == 1 + 4


def test_rank_spans_from_stdin(capsys, monkeypatch, tiny_model_dir):
    data = b'{"id": "a", "text": "Coral reefs bleach. Fish swim.", "spans": [[0, 5], [[6, 11], [20, 24]]]}\n'
    code, out, _ = run(["rank", "-g", "span", "-q", "reefs", "-p", "-", "-m", tiny_model_dir, "-f", "jsonl"],
                       capsys, stdin=data, monkeypatch=monkeypatch)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(tuple(map(tuple, r["pieces"])) for r in rows) == [((0, 5),), ((6, 11), (20, 24))]


def test_index_then_search(capsys, coral_file, tiny_model_dir, other_model_dir, tmp_path):
    idx = tmp_path / "idx"
    code, _, err = run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir], capsys)
    assert code == 0 and "indexed 4 passages" in err
    assert json.loads((idx / "manifest.json").read_text())["num_passages"] == 4
    code, out, _ = run(["search", "-i", idx, "-f", "jsonl", "-k", "2", "Great Barrier Reef"], capsys)
    assert code == 0 and len(out.splitlines()) == 2
    code, out, _ = run(["search", "-i", idx, "-g", "passage", "-f", "jsonl", "reef"], capsys)
    assert code == 0 and len(out.splitlines()) == 4
    # Another model is refused, naming the one the index was built with.
    code, _, err = run(["search", "-i", idx, "-m", other_model_dir, "reef"], capsys)
    assert code == 2 and "was built with model" in err and str(tiny_model_dir) in err
    # Existing index is kept unless --overwrite.
    code, _, err = run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir], capsys)
    assert code == 2 and "already exists" in err
    code, _, _ = run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir, "--overwrite"], capsys)
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


@pytest.mark.parametrize("argv, content, message", [
    (["rank", "-q", "x"], b'{"id": "a", "text": "ok"}\n{"id": "b" "text": "no"}\n', ":2: malformed JSON"),
    (["rank", "-q", "x"], b'{"id": "a", "text": ["no"]}\n', ":1: field 'text'"),
    (["rank", "-q", "x"], b"", "no passages"),
    (["rank", "-q", "x"], b"\xff\xfe\n", ":1: invalid UTF-8"),
    (["rank", "-q", "   "], b'{"text": "ok"}\n', "--query is empty"),
    (["rank", "-q", "x", "-g", "span"], b'{"text": "ok"}\n', "needs a JSONL 'spans' field"),
    (["rank", "-q", "x", "-m", "/no/such/model"], b'{"text": "ok"}\n', "does not exist"),
    (["index", "-i", "IDX"], b"", "no passages"),
])
def test_usage_errors_exit_2(capsys, tmp_path, tiny_model_dir, argv, content, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    argv = [a.replace("IDX", str(tmp_path / "idx")) for a in argv] + ["-p", path]
    if "-m" not in argv:
        argv += ["-m", tiny_model_dir]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err and err.startswith("agrame: error:")
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("argv", [
    ["rank", "-q", "x", "-p", "f", "-g", "word"],
    ["rank", "-q", "x", "-p", "f", "-k", "0"],
    ["rank", "-q", "x", "-p", "f", "--alpha", "nan"],
    ["search", "q"],
    [],
])
def test_argparse_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_search_missing_index(capsys, tmp_path):
    code, _, err = run(["search", "-i", tmp_path / "none", "q"], capsys)
    assert code == 2 and "does not exist" in err


def test_help_mentions_formats(capsys):
    with pytest.raises(SystemExit):
        main(["rank", "--help"])
    assert "JSONL" in capsys.readouterr().out


@pytest.fixture
def curie_files():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "examples"
    return root / "curie_answer.txt", root / "curie_passages.jsonl"


def test_cite_text_and_jsonl(capsys, curie_files, tiny_model_dir):
    answer, passages = curie_files
    code, out, _ = run(["cite", "--answer", answer, "--passages", passages, "-m", tiny_model_dir], capsys)
    assert code == 0
    body, _, refs = out.partition("\n\n")
    assert body.count("[") >= 3  # every sentence cited (no margin)
    assert all(line.startswith("[") for line in refs.strip().splitlines())
    code, out, _ = run(["cite", "-a", answer, "-p", passages, "-m", tiny_model_dir, "-f", "jsonl",
                        "--margin", "5"], capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3 and all(r["citations"] == [] for r in rows)  # a margin no gap reaches
    text = answer.read_text()
    for r in rows:
        assert text[r["start"]:r["end"]] == r["text"]
        for prop in r["propositions"]:
            assert prop["passage_id"] is None and prop["best_passage_id"] in {"curie-early-life", "curie-chemistry", "eiffel-tower"}


@pytest.mark.parametrize("argv, message", [
    (["--answer", "-", "--passages", "-"], "cannot both"),
    (["--answer", "missing.txt", "--passages", "PASSAGES"], "no such file"),
    (["--answer", "ANSWER", "--passages", "PASSAGES", "--margin", "-1"], "margin"),
    (["--answer", "ANSWER", "--passages", "PASSAGES", "--lexical-weight", "-1"], "lexical"),
])
def test_cite_usage_errors(capsys, curie_files, tiny_model_dir, argv, message):
    answer, passages = curie_files
    argv = [str(answer) if a == "ANSWER" else str(passages) if a == "PASSAGES" else a for a in argv]
    code, _, err = run(["cite", *argv, "-m", tiny_model_dir], capsys)
    assert code == 2 and message in err


def test_cite_empty_answer_from_stdin(capsys, monkeypatch, curie_files, tiny_model_dir):
    _, passages = curie_files
    code, _, err = run(["cite", "-a", "-", "-p", passages, "-m", tiny_model_dir], capsys, stdin=b"  \n",
                       monkeypatch=monkeypatch)
    assert code == 2 and "empty" in err


def test_index_add_and_search_options(capsys, coral_file, tiny_model_dir, tmp_path):
    idx = tmp_path / "idx"
    lines = coral_file.read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:2]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[2:]) + "\n")
    code, _, _ = run(["index", "-p", tmp_path / "a.jsonl", "-i", idx, "-m", tiny_model_dir, "--nbits", "4"], capsys)
    assert code == 0 and json.loads((idx / "manifest.json").read_text())["nbits"] == 4
    code, _, err = run(["index", "--add", "-p", tmp_path / "b.jsonl", "-i", idx], capsys)
    assert code == 0 and "4 in all, generation 2" in err
    code, _, err = run(["index", "--add", "-p", tmp_path / "b.jsonl", "-i", idx], capsys)
    assert code == 2 and "already in" in err
    outputs = []
    for extra in ([], ["--exact"]):
        code, out, _ = run(["search", "-i", idx, "-g", "passage", "-f", "jsonl", "reef", *extra], capsys)
        assert code == 0
        outputs.append([json.loads(line)["passage_id"] for line in out.splitlines()])
    assert sorted(outputs[0]) == sorted(outputs[1]) and len(outputs[0]) == 4
    code, out, _ = run(["search", "-i", idx, "-f", "jsonl", "reef", "--nprobe", "1", "--ncandidates", "1"], capsys)
    assert code == 0 and len({json.loads(line)["passage_id"] for line in out.splitlines()}) == 1  # one survivor


@pytest.mark.parametrize("argv, message", [
    (["search", "-i", "IDX", "   "], "query is empty"),
    (["search", "-i", "IDX", "-g", "span", "reef"], "holds no spans"),
    (["search", "-i", "IDX", "-m", "OTHER", "reef"], "search it with --model"),
    # issue 62: --add with the wrong model said "search it with --model …"
    (["index", "--add", "-p", "CORAL", "-i", "IDX", "-m", "OTHER"], "add to it with --model"),
    (["index", "--upsert", "-p", "CORAL", "-i", "IDX", "-m", "OTHER"], "upsert into it with --model"),
    (["search", "-i", "MISSING", "reef"], "does not exist"),
    (["index", "--add", "-p", "CORAL", "-i", "MISSING"], "does not exist"),
    (["index", "--add", "--overwrite", "-p", "CORAL", "-i", "IDX"], "cannot be combined"),
])
def test_search_and_add_usage_errors(capsys, coral_file, tiny_model_dir, other_model_dir, tmp_path, argv, message):
    idx = tmp_path / "idx"
    assert run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir], capsys)[0] == 0
    names = {"IDX": idx, "MISSING": tmp_path / "none", "OTHER": other_model_dir, "CORAL": coral_file}
    code, _, err = run([names.get(a, a) for a in argv], capsys)
    assert code == 2 and message in err and err.startswith("agrame: error:")


def test_damaged_index_exits_2_naming_the_file(capsys, coral_file, tiny_model_dir, tmp_path):
    idx = tmp_path / "idx"
    run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir], capsys)
    (idx / "residuals.bin").write_bytes((idx / "residuals.bin").read_bytes()[:-1])
    code, _, err = run(["search", "-i", idx, "reef"], capsys)
    assert code == 2 and "residuals.bin is truncated" in err


@pytest.mark.slow
def test_zero_shot_index_searches_without_model_flag(capsys, coral_file, tmp_path):
    idx = tmp_path / "idx"
    assert run(["index", "-p", coral_file, "-i", idx, "-m", "zero-shot"], capsys)[0] == 0
    code, out, err = run(["search", "-i", idx, "-f", "jsonl", "-k", "1", "What causes coral bleaching?"], capsys)
    assert code == 0, err
    assert len(out.splitlines()) == 1


def test_explain_cli(capsys, coral_file, tiny_model_dir, tmp_path):
    page = tmp_path / "why.html"
    code, out, _ = run(["explain", "-q", "What causes coral bleaching?", "-p", coral_file, "-m", tiny_model_dir,
                        "--html", page], capsys)
    assert code == 0 and "S(q,p)" in out and "»" in out and "\x1b" not in out
    assert page.read_text().startswith("<!doctype html>")
    code, out, _ = run(["explain", "-q", "reef", "-p", coral_file, "-m", tiny_model_dir, "--id", "coral-reefs",
                        "-f", "json"], capsys)
    assert code == 0 and json.loads(out)["passage_id"] == "coral-reefs"
    code, _, err = run(["explain", "-q", "reef", "-p", coral_file, "-m", tiny_model_dir, "--id", "nope"], capsys)
    assert code == 2 and "no passage with id 'nope'" in err
    idx = tmp_path / "idx"
    run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir], capsys)
    code, out, _ = run(["explain", "-q", "reef", "-i", idx, "--color", "always"], capsys)
    assert code == 0 and "\x1b[" in out
