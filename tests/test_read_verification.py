"""Issue 62 (reliability round four), items 1, 2 and 6: what a reader returns is checked, not what ``stat`` says.

An edit through a shared memory map changes neither mtime nor ctime; a toggling writer races any check made before a
read. Each test here failed before read verification: the edited value came back as a 200.
"""

from __future__ import annotations

import mmap
import os
import time

import pytest

from agrame.corpus import Passage
from agrame.index import Index, build_index
from agrame.index.format import IndexDamagedError, read_manifest, store_root

from reliability.corpus import TEXTS
from reliability.edits import toggling


@pytest.fixture
def built(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    passages = [Passage(f"p{i}", TEXTS[i % len(TEXTS)], metadata={"source": "wiki" if i % 2 else "news", "n": i})
                for i in range(len(TEXTS))]
    build_index(tiny_encoder, passages, path, progress=False)
    return path


def _server(built, model_dir):
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    return TestClient(create_app(built, model=str(model_dir)), raise_server_exceptions=False)


def _file(built, name):
    return store_root(built, read_manifest(built)) / name


def _text_byte(built, passage="p2"):
    """The offset in passages.jsonl of a letter inside passage ``passage``'s text."""
    data = _file(built, "passages.jsonl").read_bytes()
    line = data.find(f'"id": "{passage}"'.encode())
    if line < 0:
        line = data.find(f'"id":"{passage}"'.encode())
    at = data.find(b'"text"', line) + 12
    assert chr(data[at]).isalpha()
    return at


def _mapped_edit(file, at: int) -> None:
    """Flip one byte's case through a shared writable map (no write(2): the file's stat is left as it was)."""
    with open(file, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[at] ^= 0x20
        m.flush()


def test_a_passage_edited_through_a_shared_map_is_a_503_and_served_again_when_put_back(built, tiny_model_dir):
    client = _server(built, tiny_model_dir)
    text = client.get("/passages/p2").json()["text"]
    file, at = _file(built, "passages.jsonl"), _text_byte(built)
    with open(file, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[at] = m[at]  # the page's first write through the map touches mtime; later ones (page still dirty) do not
        assert client.get("/passages/p2").json()["text"] == text  # (the server has seen that stat)
        seen = os.stat(file)
        m[at] ^= 0x20
        assert os.stat(file).st_mtime_ns == seen.st_mtime_ns  # the edit no stat check can see
        for answer in (client.get("/passages/p2"), client.post("/search", json={"query": text[:30], "top_k": 5})):
            assert answer.status_code == 503, answer.text
            assert answer.json()["damaged"] == "passages.jsonl" and "checksum" in answer.json()["error"]
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["index"]["damaged"] == "passages.jsonl"
        m[at] ^= 0x20  # put back the same way
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/passages/p2").json()["text"] == text


@pytest.mark.parametrize("name", ["codes.bin", "residuals.bin"])
def test_vectors_edited_through_a_shared_map_do_not_change_a_served_score(built, tiny_model_dir, name):
    index = Index(built, model=str(tiny_model_dir))
    query = "coral reefs and their fish"
    expected = [(h.passage_id, round(h.score, 5)) for h in index.search(query, top_k=8)]
    file = _file(built, name)
    with open(file, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        for at in range(0, len(m), 3):  # a third of the file: every passage's vectors change
            m[at] ^= 0xFF
        m.flush()
    assert [(h.passage_id, round(h.score, 5)) for h in index.search(query, top_k=8)] == expected
    with pytest.raises(Exception, match=name):  # a fresh open sees the edit
        Index(built, model=str(tiny_model_dir))


def test_a_toggling_writer_racing_reads_never_gets_an_edited_text_through(built, tiny_model_dir):
    index = Index(built, model=str(tiny_model_dir))
    text = index.get("p2")["text"]
    file, at = _file(built, "passages.jsonl"), _text_byte(built)
    good = refused = edited = 0
    deadline = time.time() + 1.5
    with toggling(file, at, 0x20):
        while time.time() < deadline:
            try:
                got = index.get("p2")["text"]
            except IndexDamagedError as exc:
                assert exc.file == "passages.jsonl"
                refused += 1
                continue
            if got == text:
                good += 1
            else:
                edited += 1
    assert edited == 0, f"{edited} edited texts returned ({good} good, {refused} refused)"
    assert refused > 0 and good > 0, (good, refused)  # the race was run both ways
    index.check_unchanged()  # put back: served again, no restart
    assert index.get("p2")["text"] == text


def test_edited_metadata_put_back_is_served_again_without_a_restart(built, tiny_model_dir):
    client = _server(built, tiny_model_dir)
    assert client.get("/passages/p1").json()["metadata"]["source"] == "wiki"
    db = _file(built, "meta.sqlite")
    original = db.read_bytes()
    at = original.find(b'{"source": "wiki", "n": 1}') + 1  # p1's row
    assert at > 0
    edited = bytearray(original)
    edited[at + 11] ^= 0x20  # "wiki" → "Wiki": same size
    db.write_bytes(bytes(edited))
    answer = client.get("/passages/p1")
    assert answer.status_code == 503 and answer.json()["damaged"] == "meta.sqlite", answer.text
    db.write_bytes(original)
    stamp = time.time_ns() + 5_000_000_000
    os.utime(db, ns=(stamp, stamp))
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    assert client.get("/passages/p1").json()["metadata"]["source"] == "wiki"


def test_a_metadata_row_read_after_an_edit_is_refused_not_returned(built, tiny_model_dir):
    index = Index(built, model=str(tiny_model_dir))
    db = _file(built, "meta.sqlite")
    at = db.read_bytes().find(b'{"source": "wiki", "n": 1}') + 1  # p1's row (SQLite fills a page from its end)
    assert at > 0
    _mapped_edit(db, at + 11)
    index.store.meta.reopen()  # as a connection whose cache was evicted reads the page again
    with pytest.raises(IndexDamagedError) as caught:
        index.get("p1")
    assert caught.value.file == "meta.sqlite" and "digest" in str(caught.value)
    _mapped_edit(db, at + 11)
    index.check_unchanged()
    assert index.get("p1")["metadata"]["source"] == "wiki"


def test_a_search_hit_with_an_edited_metadata_row_is_refused_not_returned(built, tiny_model_dir):
    # A search reads its hits' metadata rows in one query (Index.with_metadata): each row is checked as
    # Index.get checks it, and the same answers come back once the row is put back.
    index = Index(built, model=str(tiny_model_dir))
    hits = index.search("coral", "passage", top_k=len(index))
    assert {h.passage_id: h.metadata for h in hits} == {h.passage_id: index.metadata(h.passage_id) for h in hits}
    assert hits[0].metadata is not hits[-1].metadata and any(h.metadata for h in hits)
    db = _file(built, "meta.sqlite")
    at = db.read_bytes().find(b'{"source": "wiki", "n": 1}') + 1  # p1's row
    assert at > 0
    _mapped_edit(db, at + 11)
    index.store.meta.reopen()
    with pytest.raises(IndexDamagedError) as caught:
        index.search("coral", "passage", top_k=len(index))
    assert caught.value.file == "meta.sqlite" and "digest" in str(caught.value)
    _mapped_edit(db, at + 11)
    index.check_unchanged()
    assert [(h.passage_id, h.metadata) for h in index.search("coral", "passage", top_k=len(index))] == \
        [(h.passage_id, h.metadata) for h in hits]


def test_a_filter_is_answered_from_checked_rows_never_from_an_edited_field_row(built, tiny_model_dir):
    """SQLite answers a filter from the ``fields`` rows, which no read returns (so no row check sees them): an
    edit there let a passage through a filter it fails, or kept one out. A verified reader answers filters from
    the checked passage rows instead (FieldColumns), so the edit changes no answer."""
    index = Index(built, model=str(tiny_model_dir))
    wiki = {"source": "wiki"}
    before = [(h.passage_id, h.score) for h in index.search("the", "passage", top_k=10, filter=wiki)]
    assert before and all(int(pid[1:]) % 2 for pid, _ in before)
    db = _file(built, "meta.sqlite")
    data = db.read_bytes()
    ats = [i for i in range(len(data)) if data.startswith(b"sourceswiki", i)]  # the field rows and their index
    assert ats
    for at in ats:
        _mapped_edit(db, at + 7)  # "wiki" → "Wiki" (the passage rows' JSON, "source": "wiki", is left alone)
    index.store.meta.reopen()
    assert index.store.meta.positions(wiki, len(index.store)).size == 0  # (SQLite's own answer did change)
    same = {"source": {"$in": ["wiki"]}}  # a filter not cached before the edit
    assert [(h.passage_id, h.score) for h in index.search("the", "passage", top_k=10, filter=same)] == before
    for at in ats:
        _mapped_edit(db, at + 7)


def test_a_filter_over_an_edited_passage_row_is_refused(built, tiny_model_dir):
    index = Index(built, model=str(tiny_model_dir))
    db = _file(built, "meta.sqlite")
    at = db.read_bytes().find(b'{"source": "wiki", "n": 1}') + 1
    assert at > 0
    _mapped_edit(db, at + 11)
    index.store.meta.reopen()
    with pytest.raises(IndexDamagedError) as caught:
        index.search("the", "passage", top_k=10, filter={"source": "news"})
    assert caught.value.file == "meta.sqlite" and "position 1" in str(caught.value)
    _mapped_edit(db, at + 11)
    index.check_unchanged()
    assert index.search("the", "passage", top_k=10, filter={"source": "news"})


def test_a_served_index_does_not_digest_its_metadata_again_at_every_request(built, tiny_model_dir, monkeypatch):
    """Our own fresh connection recreated meta.sqlite's empty -wal at every check, a new inode each time, which the
    next check took for a write: every request digested every metadata row (found timing GET /passages)."""
    from agrame.index import metadata

    calls = []
    verify = metadata.MetadataDB.verify
    monkeypatch.setattr(metadata.MetadataDB, "verify", lambda self, *a, **k: calls.append(1) or verify(self, *a, **k))
    client = _server(built, tiny_model_dir)
    for _ in range(20):
        assert client.get("/passages/p1").status_code == 200
    assert len(calls) <= 2, len(calls)  # the open's, and at most one more
