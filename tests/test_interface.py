"""The command line and the HTTP API are the same to a user across refactors (issue 54): every
subcommand's ``--help`` and the OpenAPI schema equal the snapshots in ``tests/data/interface``.

A change meant to alter them rewrites the snapshots on purpose, reviewed in the diff:
``python -m tests.test_interface`` (then commit ``tests/data/interface``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "data" / "interface"
COMMANDS = ("rank", "index", "search", "evaluate", "qrels", "export", "delete", "compact", "explain", "serve", "cite",
            "models", "train")
WIDTH = "100"  # argparse wraps to the terminal: a fixed width


def help_text(command: str | None) -> str:
    from agrame_app.cli import main

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(([command] if command else []) + ["--help"])
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue()


def openapi(model_dir: Path, index: Path) -> dict:
    from agrame_app.serve import create_app

    app = create_app(str(index), str(model_dir), allow_writes=True, api_key="k")
    return json.loads(json.dumps(app.openapi(), sort_keys=True))


@pytest.mark.parametrize("command", (None,) + COMMANDS)
def test_help_is_unchanged(command):
    name = f"help-{command or 'agrame'}.txt"
    assert help_text(command) == (HERE / name).read_text(), f"agrame {command or ''} --help changed ({name})"


def test_the_openapi_schema_is_unchanged(tmp_path, tiny_model_dir, coral_file):
    from agrame.index import build_index
    from agrame.io import read_passages
    from agrame.loading import load_encoder

    build_index(load_encoder(str(tiny_model_dir)), read_passages(str(coral_file)), tmp_path / "ix", progress=False)
    assert openapi(tiny_model_dir, tmp_path / "ix") == json.loads((HERE / "openapi.json").read_text())


def _write_snapshots() -> None:  # pragma: no cover - run by hand when a change is meant
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import _make_tiny_encoder

    HERE.mkdir(parents=True, exist_ok=True)
    for command in (None,) + COMMANDS:
        (HERE / f"help-{command or 'agrame'}.txt").write_text(help_text(command))
    from agrame.index import build_index
    from agrame.io import read_passages

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        encoder = _make_tiny_encoder()
        encoder.save(model)
        coral = Path(__file__).resolve().parent.parent / "examples" / "coral.jsonl"
        build_index(encoder, read_passages(str(coral)), Path(tmp) / "ix", progress=False)
        (HERE / "openapi.json").write_text(json.dumps(openapi(model, Path(tmp) / "ix"), indent=1, sort_keys=True) + "\n")
    print(f"wrote {HERE}")


if __name__ == "__main__":  # pragma: no cover
    _write_snapshots()
