"""Passage files: formats and error messages that name file, line and field."""

from __future__ import annotations

import pytest

from agrame.io import InputError, read_passages


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_jsonl_tsv_and_text(tmp_path):
    jsonl = write(tmp_path, "p.jsonl", b'{"id": "a", "text": "One."}\n\n{"id": 7, "text": "Two.", "spans": [[0, 3]]}\n')
    ps = read_passages(jsonl)
    assert [(p.id, p.text, p.spans) for p in ps] == [("a", "One.", None), ("7", "Two.", (((0, 3),),))]
    tsv = write(tmp_path, "p.tsv", "x\tcafé au lait\ty\n".encode())
    assert read_passages(tsv)[0].text == "café au lait\ty"
    txt = write(tmp_path, "p.txt", "\ufefffirst line\r\n\nsecond line\n".encode())
    assert [(p.id, p.text) for p in read_passages(txt)] == [("0", "first line"), ("1", "second line")]
    sniffed = write(tmp_path, "p", b'{"text": "auto"}\n')
    assert read_passages(sniffed)[0].text == "auto"


@pytest.mark.parametrize("name, data, fmt, where", [
    ("a.jsonl", b'{"id": "a", "text": "ok"}\n{"id": "b", "text": 3}\n', "auto", ":2: field 'text'"),
    ("a.jsonl", b'{"id": "a", "text": "ok"}\n{"id": "b" "text": "x"}\n', "auto", ":2: malformed JSON"),
    ("a.jsonl", b'{"id": "a"}\n', "auto", ":1: field 'text': missing"),
    ("a.jsonl", b'["a"]\n', "auto", ":1: expected a JSON object"),
    ("a.jsonl", b'{"id": "a", "text": "  "}\n', "auto", ":1: field 'text': empty"),
    ("a.jsonl", b'{"id": [1], "text": "x"}\n', "auto", ":1: field 'id'"),
    ("a.jsonl", b'{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "auto", ":2: field 'id': duplicate"),
    ("a.jsonl", b'{"id": "a", "text": "abc", "spans": [[0, 9]]}\n', "auto", ":1: field 'spans'"),
    ("a.jsonl", b'{"id": "a", "text": "abc", "spans": 3}\n', "auto", ":1: field 'spans'"),
    ("a.tsv", b"a\tok\nno tab here\n", "auto", ":2: expected id<TAB>text"),
    ("a.tsv", b"a\t \n", "auto", ":1: field 'text'"),
    ("a.txt", b"fine\n\xc3\x28 broken\n", "auto", ":2: invalid UTF-8"),
    ("a.txt", b"\n  \n", "auto", "no passages"),
    ("a.txt", b"x\n", "csv", "unknown input format"),
])
def test_errors_name_file_line_and_field(tmp_path, name, data, fmt, where):
    path = write(tmp_path, name, data)
    with pytest.raises(InputError) as info:
        read_passages(path, fmt)
    message = str(info.value)
    assert where in message
    if fmt == "auto":
        assert message.startswith(path)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_passages(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="folder"):
        read_passages(str(tmp_path))


def test_parquet_passages_read_and_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agrame.io import InputError, read_passages

    good = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["Reefs grow slowly.", "Coral bleaches."],
                             "metadata": ['{"year": 2020}', None]}), good)
    passages = read_passages(str(good))
    assert [(p.id, p.text, p.metadata) for p in passages] == [("a", "Reefs grow slowly.", {"year": 2020}),
                                                              ("b", "Coral bleaches.", None)]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["ok", " "]}), bad)
    with pytest.raises(InputError, match=r"bad.parquet:2: field 'text': empty text"):
        read_passages(str(bad))
    notext = tmp_path / "notext.parquet"
    pq.write_table(pa.table({"body": ["x"]}), notext)
    with pytest.raises(InputError, match="no 'text' column"):
        read_passages(str(notext))
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        read_passages(str(fake))
