"""Issue 63: the server logs a line a request (method, path, status, ms), never the query text unless asked."""

from __future__ import annotations

import logging
import re

from fastapi.testclient import TestClient

from agrame.index import build_index
from agrame.io import read_passages
from agrame_app.cli import main
from agrame_app.serve import create_app


def test_each_request_is_one_access_line_without_the_query_text(tmp_path, tiny_encoder, tiny_model_dir, coral_file,
                                                                 caplog):
    build_index(tiny_encoder, read_passages(str(coral_file)), tmp_path / "ix", progress=False)
    client = TestClient(create_app(tmp_path / "ix", model=str(tiny_model_dir)), raise_server_exceptions=False)
    with caplog.at_level(logging.INFO, logger="agrame.access"):
        client.get("/health")
        client.post("/search", json={"query": "a secret question about reefs"})
        client.get("/passages/no-such-id?token=abc")
    lines = [r.getMessage() for r in caplog.records if r.name == "agrame.access"]
    assert len(lines) == 3, lines
    assert re.fullmatch(r"GET /health 200 \d+\.\d ms", lines[0])
    assert re.fullmatch(r"POST /search 200 \d+\.\d ms", lines[1])
    assert re.fullmatch(r"GET /passages/no-such-id 404 \d+\.\d ms", lines[2])
    assert "secret" not in " ".join(lines) and "token" not in " ".join(lines)
    caplog.clear()
    client = TestClient(create_app(tmp_path / "ix", model=str(tiny_model_dir), log_queries=True))
    with caplog.at_level(logging.INFO, logger="agrame.access"):
        client.get("/passages/no-such-id?token=abc")
    assert [r.getMessage().rsplit(" ", 2)[0] for r in caplog.records if r.name == "agrame.access"] == \
        ["GET /passages/no-such-id?token=abc 404"]


def test_serve_takes_a_log_level(capsys):
    code = None
    try:
        main(["serve", "--log-level", "loud"])
    except SystemExit as stop:
        code = stop.code
    assert code == 2 and "--log-level" in capsys.readouterr().err
