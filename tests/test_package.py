"""The package as a user installs it (issues 60 and 63): the wheel's contents and size, and what a wheel's user
is told about the shipped models it leaves out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from agrame.encoder import ModelError

REPO = Path(__file__).resolve().parent.parent
#: issue 63's target for the wheel
WHEEL_MB = 15


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    # from a copy of the checkout's files: an in-place build reuses build/lib, whose stale files (a model the
    # wheel no longer carries) would go into the wheel
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-w", str(out), "-q"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (found,) = out.glob("agrame-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_installs_no_top_level_research_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {"agrame", "agrame_app", "propcite"} <= tops
    assert not tops & {"training", "benchmarks", "tests"}, sorted(tops)
    assert "agrame/training/trainer.py" in names


@pytest.mark.slow
def test_the_wheel_carries_the_default_model_only_and_is_small(wheel):
    from agrame.loading import DEFAULT_MODEL, NOT_IN_WHEEL

    names = zipfile.ZipFile(wheel).namelist()
    models = {n.split("/")[2] for n in names if n.startswith("agrame/models/") and n.count("/") == 3}
    assert DEFAULT_MODEL in models and f"agrame/models/{DEFAULT_MODEL}/delta.safetensors" in names
    assert not models & set(NOT_IN_WHEEL), sorted(models)
    assert "agrame/models/cards.json" in names
    assert wheel.stat().st_size <= WHEEL_MB * 2**20, f"{wheel.stat().st_size / 2**20:.1f} MB"


def test_the_models_left_out_are_the_ones_pyproject_excludes():
    excluded = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["exclude-package-data"]
    from agrame.loading import NOT_IN_WHEEL

    assert sorted(excluded["agrame"]) == sorted(f"models/{n}/*" for n in NOT_IN_WHEEL)


def test_a_wheel_user_is_told_how_to_load_a_model_left_out(tmp_path, monkeypatch, capsys):
    import agrame.loading as loading
    from agrame_app.cli import main

    models = tmp_path / "models"
    shutil.copytree(loading.MODELS_DIR, models, ignore=shutil.ignore_patterns(*loading.NOT_IN_WHEEL))
    monkeypatch.setattr(loading, "MODELS_DIR", models)  # the folder as the wheel installs it
    with pytest.raises(ModelError, match="the wheel leaves out") as caught:
        loading.load_encoder("squad-a1")
    assert "CLONE/agrame/models/squad-a1" in str(caught.value)
    assert main(["models", "-f", "jsonl"]) == 0
    listed = {m["name"]: m for m in map(json.loads, capsys.readouterr().out.splitlines())}
    assert listed["squad-a1"]["installed"] is False and "pip install -e" in listed["squad-a1"]["how"]
    assert listed["gpu2100-agrame128"]["installed"] is True
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "squad-a1 (not installed)" in out and "not installed: the wheel carries the default model only" in out
