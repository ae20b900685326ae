"""The HTTP API on the tiny model, through FastAPI's test client (no network)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from agrame.corpus import Passage  # noqa: E402
from agrame.index import add_passages, build_index  # noqa: E402
from agrame_app.serve import Limits, create_app  # noqa: E402

TEXTS = ["Coral reefs are built by polyps. Warm water causes coral bleaching.",
         "The Great Barrier Reef lies off Queensland. It is visible from space.",
         "Marie Curie was born in Warsaw. She won two Nobel prizes."]


@pytest.fixture
def served(tmp_path, tiny_encoder, tiny_model_dir):
    path = tmp_path / "ix"
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS)], path, progress=False)
    app = create_app(path, model=str(tiny_model_dir), limits=Limits(max_passages=3, max_top_k=20))
    return TestClient(app), path


def test_health_search_and_page(served):
    client, _ = served
    health = client.get("/health").json()
    assert health["index"]["passages"] == 3 and health["index"]["generation"] == 1
    r = client.post("/search", json={"query": "coral bleaching", "granularity": "sentence", "top_k": 2,
                                     "explain": True})
    assert r.status_code == 200
    hits = r.json()["results"]
    assert len(hits) == 2 and hits[0]["score"] >= hits[1]["score"]
    top = hits[0]
    assert TEXTS[int(top["passage_id"])][top["start"]:top["end"]] == top["text"]
    assert top["passage_text"] == TEXTS[int(top["passage_id"])] and top["tokens"] and top["query_tokens"]
    page = client.get("/")
    assert page.status_code == 200 and "<title>AGRaME</title>" in page.text


def test_rank_and_cite(served):
    client, _ = served
    r = client.post("/rank", json={"query": "reef", "passages": [TEXTS[0], {"id": "x", "text": TEXTS[1]}],
                                   "granularity": "passage", "top_k": 5})
    assert r.status_code == 200 and {h["passage_id"] for h in r.json()["results"]} == {"0", "x"}
    r = client.post("/cite", json={"answer": "Marie Curie was born in Warsaw.", "passages": TEXTS})
    assert r.status_code == 200
    body = r.json()
    assert body["sentences"][0]["citations"] and "[" in body["text"]


@pytest.mark.parametrize("path, body, status, message", [
    ("/search", {"query": "  "}, 400, "query is empty"),
    ("/search", {"query": "reef", "top_k": 50}, 413, "top_k 50"),
    ("/search", {"query": "reef", "granularity": "word"}, 422, "granularity"),
    ("/search", {"query": "reef", "granularity": "span"}, 400, "holds no spans"),
    ("/search", {}, 422, "query"),
    ("/rank", {"query": "reef", "passages": TEXTS + ["four"]}, 413, "at most 3"),
    ("/rank", {"query": "reef", "passages": []}, 400, "no passages"),
    ("/cite", {"answer": "", "passages": TEXTS}, 400, "answer is empty"),
    ("/cite", {"answer": "x", "passages": TEXTS, "margin": -1}, 422, "margin"),
])
def test_errors_are_json_4xx(served, path, body, status, message):
    client, _ = served
    r = client.post(path, json=body)
    assert r.status_code == status and message in r.json()["error"]


def test_no_request_names_a_file(served):
    client, _ = served
    for path in ("/search", "/rank", "/cite"):
        r = client.post(path, json={"query": "x", "answer": "x", "passages": ["a"], "index": "/etc", "path": "/etc"})
        assert "/etc" not in json.dumps(r.json())
    assert client.get("/static/../../etc/passwd").status_code == 404


def test_add_is_picked_up_between_requests(served, tiny_encoder):
    client, path = served
    before = client.post("/search", json={"query": "Eiffel Tower Paris", "granularity": "passage", "top_k": 10}).json()
    assert before["generation"] == 1 and {h["passage_id"] for h in before["results"]} == {"0", "1", "2"}
    add_passages(path, tiny_encoder, [Passage("eiffel", "The Eiffel Tower is in Paris.")], progress=False)
    after = client.post("/search", json={"query": "Eiffel Tower Paris", "granularity": "passage", "top_k": 10}).json()
    assert after["generation"] == 2 and after["passages"] == 4
    assert "eiffel" in {h["passage_id"] for h in after["results"]}
    assert client.get("/health").json()["index"]["passages"] == 4


def test_server_without_index(tiny_model_dir):
    client = TestClient(create_app(None, model=str(tiny_model_dir)))
    assert client.post("/search", json={"query": "x"}).status_code == 404
    assert client.post("/rank", json={"query": "reef", "passages": TEXTS}).status_code == 200


# -- writes, auth and filters --------------------------------------------------------------------

KEY = "s3cret-key"


@pytest.fixture
def writable(tmp_path, tiny_encoder, tiny_model_dir):
    path = tmp_path / "wx"
    build_index(tiny_encoder, [Passage(str(i), t, metadata={"n": i, "kind": "even" if i % 2 == 0 else "odd"})
                               for i, t in enumerate(TEXTS)], path, progress=False)
    app = create_app(path, model=str(tiny_model_dir), allow_writes=True, api_key=KEY)
    return TestClient(app), path


def test_writes_need_allow_writes_and_the_key(served, writable):
    read_only, _ = served
    r = read_only.post("/passages", json={"passages": [{"id": "n", "text": "new"}]},
                       headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 403 and "read-only" in r.json()["error"]
    client, _ = writable
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": KEY[:-1]}):
        r = client.post("/passages", json={"passages": [{"id": "n", "text": "new"}]}, headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]
        assert client.request("DELETE", "/passages", json={"ids": ["0"]}, headers=headers).status_code == 401
    assert client.get("/passages/0").status_code == 200  # reads are open unless --protect-reads


def test_upsert_delete_get_and_filtered_search_over_http(writable):
    client, _ = writable
    auth = {"X-API-Key": KEY}
    r = client.post("/passages", headers=auth, json={"passages": [
        {"id": "1", "text": "Reef sharks hunt at night. They sleep by day.", "metadata": {"kind": "fish", "n": 10}},
        {"id": "new", "text": "Penguins live in the south.", "metadata": {"kind": "bird", "tags": ["cold"]}}]})
    assert r.status_code == 200 and r.json()["upserted"] == 2 and r.json()["passages"] == 4
    got = client.get("/passages/1").json()
    assert got["text"].startswith("Reef sharks") and got["metadata"] == {"kind": "fish", "n": 10}
    assert client.get("/passages/nope").status_code == 404
    r = client.post("/search", json={"query": "reef", "granularity": "passage", "top_k": 5,
                                     "filter": {"n": {"$gte": 1}}})
    assert {h["passage_id"] for h in r.json()["results"]} == {"2", "1"}
    r = client.post("/rank", json={"query": "reef", "ids": ["0", "1", "new"], "granularity": "passage",
                                   "filter": {"tags": "cold"}})
    assert r.status_code == 200 and [h["passage_id"] for h in r.json()["results"]] == ["new"]
    r = client.request("DELETE", "/passages", headers=auth, json={"ids": ["0", "ghost"]})
    assert r.status_code == 404 and "'ghost'" in r.json()["error"]
    r = client.request("DELETE", "/passages", headers=auth, json={"ids": ["0", "ghost"], "missing": "ok"})
    assert r.status_code == 200 and r.json()["deleted"] == 1
    r = client.request("DELETE", "/passages", headers=auth, json={"filter": {"kind": "bird"}})
    assert r.status_code == 200 and r.json()["deleted"] == 1
    assert client.get("/health").json()["index"]["passages"] == 2
    r = client.post("/search", json={"query": "reef", "filter": {"n": {"$regex": "x"}}})
    assert r.status_code == 400 and "unknown operator" in r.json()["error"]


def test_protected_reads(tmp_path, tiny_encoder, tiny_model_dir):
    path = tmp_path / "px"
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS)], path, progress=False)
    client = TestClient(create_app(path, model=str(tiny_model_dir), api_key=KEY, protect_reads=True))
    assert client.post("/search", json={"query": "reef"}).status_code == 401
    assert client.post("/search", json={"query": "reef"}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/").status_code == 200


def test_serve_load_write_phase_on_a_real_server(tmp_path, tiny_encoder, tiny_model_dir):
    """benchmarks.serve_load's third phase, small: readers and an HTTP writer, nothing lost or mixed."""
    import argparse

    from benchmarks.browser_check import Server
    from benchmarks.serve_load import _write_phase

    path = tmp_path / "lx"
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS * 4)], path, progress=False)
    added = tmp_path / "texts.jsonl"
    added.write_text("".join(json.dumps({"id": f"x{i}", "text": f"Reef number {i} bleaches in warm water."}) + "\n"
                             for i in range(12)))
    args = argparse.Namespace(clients=2, requests=5, seconds=120, write_rounds=3, write_batch=3)
    queries = ["coral reef", "Warsaw", "space"] * 80
    with Server(create_app(path, model=str(tiny_model_dir), allow_writes=True, api_key=KEY)) as server:
        result = _write_phase(server.port, KEY, queries, added, args)
    assert result["errors"] == 0 and result["write_errors"] == 0 and result["mixed"] == 0
    assert result["lost"] == 0 and result["returned_after_delete"] == 0
    assert result["readers_returned_after_delete"] == 0 and result["responses_checked_against_known_generation"] > 0


def test_serve_opens_its_index_once_and_reads_its_manifest_once_per_open(tmp_path, tiny_model_dir, coral_file,
                                                                         monkeypatch):
    # A spy on every name the manifest reader is imported under: serving a folder opens it once (its
    # model is the server's), and a newer generation committed beside the server is opened with one more.
    import sys

    from fastapi.testclient import TestClient

    import agrame.index.format as format_module
    from agrame.index import build_index
    from agrame.io import read_passages
    from agrame.loading import load_encoder
    from agrame_app.serve import create_app

    encoder = load_encoder(str(tiny_model_dir))
    build_index(encoder, read_passages(str(coral_file)), tmp_path / "ix", progress=False)
    original, calls = format_module.read_manifest, []

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "read_manifest", None) is original:
            monkeypatch.setattr(module, "read_manifest", spy)
    app = create_app(str(tmp_path / "ix"), str(tiny_model_dir))
    assert len(calls) == 1
    client = TestClient(app)
    assert client.post("/search", json={"query": "coral", "top_k": 2}).status_code == 200
    assert len(calls) == 1  # a request reads no manifest (two stat calls tell a new generation)
    from agrame.index import Index

    with monkeypatch.context() as m:  # a writer beside the server (its own reads are not the server's)
        m.setattr(format_module, "read_manifest", original)
        for module in list(sys.modules.values()):
            if getattr(module, "read_manifest", None) is spy:
                m.setattr(module, "read_manifest", original)
        Index(tmp_path / "ix", model=encoder).delete(["coral-reefs"])
    assert client.post("/search", json={"query": "coral", "top_k": 2}).json()["generation"] > 1
    assert len(calls) == 2


def test_a_reopen_racing_a_writer_is_tried_again(served, tiny_encoder, monkeypatch):
    """A writer that commits while the server opens the new generation may replace the metadata file under
    SQLite ("disk I/O error", seen under the write load): the open is tried again, never a 500, and a
    reopen that keeps failing says to retry (503, Retry-After) and is tried again on the next request."""
    import sqlite3

    import agrame.index.sharded as sharded

    client, path = served
    client.post("/search", json={"query": "reef"})
    add_passages(path, tiny_encoder, [Passage("new", "Parrotfish graze algae off reefs.")], progress=False)
    real, failures = sharded.open_index, [1]

    def flaky(*args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return real(*args, **kwargs)

    monkeypatch.setattr(sharded, "open_index", flaky)
    r = client.post("/search", json={"query": "parrotfish", "granularity": "passage", "top_k": 1})
    assert r.status_code == 200 and r.json()["generation"] == 2 and r.json()["passages"] == 4

    add_passages(path, tiny_encoder, [Passage("newer", "Sea turtles eat seagrass.")], progress=False)
    failures[0] = 10  # more than one request's tries
    # an add supersedes no file of the generation served (appends; the lists are derived from the codes):
    # while the reopen fails, that generation keeps answering
    r = client.post("/search", json={"query": "turtles", "granularity": "passage", "top_k": 1})
    assert r.status_code == 200 and r.json()["generation"] == 2 and r.json()["passages"] == 4
    # a compaction removes the store the served generation reads: it changed under it, so retry later
    from agrame.index import IndexWriter

    with IndexWriter(path) as writer:
        writer.delete(["new"])
        writer.compact()
    r = client.post("/search", json={"query": "turtles", "granularity": "passage", "top_k": 1})
    assert r.status_code == 503 and "Retry-After" in r.headers and "being updated" in r.json()["error"]
    failures[0] = 0
    r = client.post("/search", json={"query": "turtles", "granularity": "passage", "top_k": 1})
    assert r.status_code == 200 and r.json()["generation"] > 3 and r.json()["passages"] == 4


@pytest.mark.parametrize("field,value", [("top_k", "5"), ("top_k", True), ("explain", "yes"), ("explain", 1),
                                         ("nprobe", "8"), ("allow_partial", "true")])
def test_request_fields_are_strictly_typed(served, field, value):
    # issue 62: "5" was taken as top_k 5 and "yes" as explain: a 422 names the field instead
    client, _ = served
    reply = client.post("/search", json={"query": "reef", field: value})
    assert reply.status_code == 422 and field in reply.json()["error"], reply.text
    assert client.post("/search", json={"query": "reef", "top_k": 2, "explain": True}).status_code == 200


def test_health_is_degraded_when_the_folder_is_swapped_for_an_index_of_another_model(tmp_path, tiny_encoder,
                                                                                     tiny_model_dir, other_model_dir):
    # issue 62: /search answered 400 while /health stayed ok
    import shutil

    from agrame.loading import load_encoder

    path = tmp_path / "ix"
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS)], path, progress=False)
    client = TestClient(create_app(path, model=str(tiny_model_dir)))
    assert client.get("/health").status_code == 200
    other = tmp_path / "other"
    build_index(load_encoder(str(other_model_dir)), [Passage(str(i), t) for i, t in enumerate(TEXTS)], other,
                progress=False)
    shutil.rmtree(path)
    other.rename(path)
    assert client.post("/search", json={"query": "reef"}).status_code >= 400
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert "cannot serve" in health.json()["error"] and "was built with model" in health.json()["error"]
