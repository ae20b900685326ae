"""Hostile input at a small budget (``python -m reliability.hardening`` runs the long versions):
no traceback, no 5xx, the documented error shape, nothing changed by a refused operation."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability import hardening
from agrame_app.cli import main, printable
from agrame.index import Index, IndexFolderError, verify_crc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return hardening.tiny_index(tmp_path_factory.mktemp("hostile"))


def test_manifest_byte_flips_are_all_refused_or_harmless(tiny):
    index, encoder, _ = tiny
    size = len((index / "manifest.json").read_bytes())
    result = hardening.flip_sweep(index, encoder, positions=range(0, size, 3), masks=(1, 32, 128))
    assert result["tracebacks"] == 0 and result["accepted_damage"] == 0, result["examples"]
    assert result["refused"] > 0.95 * result["flips"]
    verify_crc(index)  # the sweep puts the manifest back


def test_manifest_schema_names_the_field(tiny, tmp_path):
    import shutil

    index, encoder, _ = tiny
    shutil.copytree(index, tmp_path / "ix")
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    for field, value, message in [("num_passages", -1, "'num_passages' must be a non-negative integer"),
                                  ("code_dtype", "<f8", "'code_dtype' must be"),
                                  ("dim", 32, "'files' records"), ("generation", "2", "'generation' must be")]:
        broken = {**manifest, field: value}
        broken.pop("checksum")  # as an older writer would leave it: the schema alone must catch it
        (tmp_path / "ix" / "manifest.json").write_text(json.dumps(broken))
        with pytest.raises(IndexFolderError, match=f"is damaged: manifest.json field {message}"):
            Index(tmp_path / "ix", model=encoder)
    tampered = {**manifest, "num_tokens": manifest["num_tokens"]}
    tampered["created"] = "1999-01-01T00:00:00Z"
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(tampered))
    with pytest.raises(IndexFolderError, match="does not match its checksum"):
        verify_crc(tmp_path / "ix")


def test_cli_fuzz(tiny, tmp_path):
    index, _, model = tiny
    result = hardening.fuzz_cli(60, 1, index, model, tmp_path / "inputs")
    assert result["tracebacks"] == 0 and result["other_exit"] == 0 and result["bad_message"] == 0, result["examples"]
    assert result.get("changed_after_refusal", 0) == 0


def test_passage_file_fuzz():
    result = hardening.fuzz_files(200, 2)
    assert result["tracebacks"] == 0 and result["refused"] > 0, result["examples"]


def test_http_fuzz(tiny):
    index, _, model = tiny
    result = hardening.fuzz_http(200, 3, index, model)
    assert result.get("5xx", 0) == 0 and result["bad_shape"] == 0, result["examples"]
    assert result["4xx"] > 0 and result["changed_after_refusal"] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_printable_escapes_every_control_and_bidi_character(text):
    import unicodedata

    out = printable(text)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in out)


def test_invalid_utf8_arguments_exit_2_before_any_model_work(tiny, capsys):
    index, _, model = tiny
    for argv in (["search", "-i", str(index), "music \udcff"], ["rank", "-q", "x\ud800", "-p", "nofile"],
                 ["explain", "-q", "\udcff", "-i", str(index)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("agrame: error:") and "not valid UTF-8" in err and "Traceback" not in err


def test_surrogates_over_http_are_400_naming_the_field(tiny):
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    index, _, model = tiny
    client = TestClient(create_app(index, model=str(model)), raise_server_exceptions=False)
    r = client.post("/search", content=b'{"query": "music \\ud800"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json() == {"error": "body.query: not valid Unicode (a lone surrogate)"}
    r = client.post("/rank", content=b'{"query": "reef", "passages": [{"id": "\\ud800", "text": "x"}]}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "body.passages[0].id" in r.json()["error"]
    r = client.post("/search", content=b'{"query": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("body: malformed JSON")
    r = client.post("/search", content=b"query=reef", headers={"Content-Type": "text/plain"})
    assert r.status_code == 422 and "expected a JSON object" in r.json()["error"]
    assert client.get("/nowhere").json() == {"error": "not found: Not Found"}


def test_heavy_requests_beyond_the_budget_get_503(tiny):
    from fastapi.testclient import TestClient

    from agrame_app.serve import Limits, create_app
    from agrame_app.serve.service import Gate as _Gate

    gate = _Gate(1, 100)
    gate.enter(80)
    with pytest.raises(Exception, match="busy"):
        gate.enter(10)
    gate.leave(80)
    gate.enter(500)  # alone, a request over the budget still runs
    gate.leave(500)
    index, _, model = tiny
    app = create_app(index, model=str(model), limits=Limits(max_heavy=0))
    r = TestClient(app).post("/rank", json={"query": "reef", "passages": ["Reefs grow."]})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "busy" in r.json()["error"]
