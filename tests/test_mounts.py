"""Issue 62, items 2 and 3: an index on a read-only mount is searched, explained and served; a full disk breaks no
read and leaves no lock held; every write there is refused naming the mount or the file.

Real mounts, in a private mount namespace of a child process (``unshare --user --map-root-user --mount``): a
read-only bind mount of the index's folder, and a small tmpfs filled up. Where the kernel allows no user
namespace, the test is skipped and says so (never counted as passing).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agrame.corpus import Passage
from agrame.index import build_index

from reliability.corpus import TEXTS

REPO = Path(__file__).resolve().parent.parent


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces(), reason="no user/mount namespaces here (unshare -rm fails): "
                                                           "the mount tests cannot run")


def _in_namespace(setup: str, script: str, timeout: float = 240) -> dict:
    """Run ``setup`` (shell: mounts) then ``script`` (Python) inside a private mount namespace; its JSON."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
    shell = f"set -e\n{setup}\nexec {shlex.quote(sys.executable)} {shlex.quote(f.name)}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", shell], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)
    os.unlink(f.name)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _passages(n: int = len(TEXTS)):
    return [Passage(f"p{i}", TEXTS[i % len(TEXTS)], metadata={"n": i}) for i in range(n)]


PROBE = """
    import json, sys, io, contextlib
    from agrame.index import Index
    from agrame_app.cli import main
    from fastapi.testclient import TestClient
    from agrame_app.serve import create_app
    path, model = sys.argv[1:3] if len(sys.argv) > 2 else (PATH, MODEL)
    out, KEY = {}, {"X-API-Key": "k"}
    index = Index(path, model=model)
    out["search"] = [h.passage_id for h in index.search("coral reef", top_k=3)]
    out["explain"] = bool(index.explain("coral reef", "p1"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        out["cli_search"] = main(["search", "-i", path, "-m", model, "coral reef"])
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        out["cli_delete"] = main(["delete", "-i", path, "p1"])
    out["cli_err"] = err.getvalue()
    client = TestClient(create_app(path, model=model, allow_writes=True, api_key="k"), raise_server_exceptions=False)
    out["health"] = client.get("/health").status_code
    out["http_search"] = client.post("/search", json={"query": "coral reef"}).status_code
    out["http_get"] = client.get("/passages/p1").json().get("text", "")[:10]
    answer = client.request("DELETE", "/passages", json={"ids": ["p1"]}, headers=KEY)
    out["http_delete"] = [answer.status_code, answer.json().get("error", "")]
    print(json.dumps(out))
"""


def _probe(path: Path, model: Path) -> str:
    return PROBE.replace("PATH, MODEL", f"{str(path)!r}, {str(model)!r}")


@pytest.mark.parametrize("written", [False, True], ids=["fresh", "written-to"])
def test_an_index_on_a_read_only_mount_is_searched_and_served_and_writes_name_the_mount(tmp_path, tiny_encoder,
                                                                                        tiny_model_dir, written):
    mount = tmp_path / "volume"
    path = mount / "ix"
    build_index(tiny_encoder, _passages(), path, progress=False)
    if written:  # a write after the build: the WAL files and the lock file exist, as a shipped volume may hold
        from agrame.index import Index

        Index(path, model=str(tiny_model_dir)).delete(["p3"])
    before = {p.name: p.stat().st_size for p in path.rglob("*")}
    got = _in_namespace(f"mount --bind {mount} {mount}\nmount -o remount,bind,ro {mount}",
                        _probe(path, tiny_model_dir))
    assert got["search"] and got["explain"] and got["cli_search"] == 0, got
    assert got["health"] == 200 and got["http_search"] == 200 and got["http_get"], got
    assert got["cli_delete"] == 2 and "read-only" in got["cli_err"] and str(mount) in got["cli_err"], got
    status, message = got["http_delete"]
    assert status == 409 and "read-only" in message, got
    assert {p.name: p.stat().st_size for p in path.rglob("*")} == before  # nothing written beside it


def test_a_full_disk_breaks_no_read_answers_507_and_the_next_write_succeeds(tmp_path, tiny_encoder, tiny_model_dir):
    script = """
    import json, os, sys, io, contextlib, shutil
    from pathlib import Path
    from agrame.index import Index
    from agrame_app.cli import main
    from fastapi.testclient import TestClient
    from agrame_app.serve import create_app
    src, disk, model = Path(SRC), Path(DISK), MODEL
    path = disk / "ix"
    shutil.copytree(src, path)
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    for block in (65536, 4096, 1):  # the disk filled up, to the last byte
        try:
            while True:
                os.write(fd, b"x" * block)
        except OSError:
            pass
    os.close(fd)
    out, KEY = {}, {"X-API-Key": "k"}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        out["cli_search"] = main(["search", "-i", str(path), "-m", model, "coral reef"])
    out["search_err"] = err.getvalue()[-300:]
    client = TestClient(create_app(str(path), model=model, allow_writes=True, api_key="k"), raise_server_exceptions=False)
    out["health"] = client.get("/health").status_code
    out["http_search"] = client.post("/search", json={"query": "coral reef"}).status_code
    answers = {}
    a = client.request("DELETE", "/passages", json={"ids": ["p1"]}, headers=KEY)
    answers["delete"] = [a.status_code, a.text[:300]]
    a = client.post("/passages", json={"passages": [{"id": "new", "text": "a long new passage " * 200}]},
                    headers=KEY)
    answers["upsert"] = [a.status_code, a.text[:300]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        out["cli_compact"] = [main(["compact", "-i", str(path)]), err.getvalue()[-300:]]
    out["writes"] = answers
    out["search_after"] = client.post("/search", json={"query": "coral reef"}).status_code
    os.remove(filler)
    a = client.request("DELETE", "/passages", json={"ids": ["p1"]}, headers=KEY)
    out["delete_after_freeing"] = [a.status_code, a.text[:300]]
    out["lock_left"] = [p.name for p in path.rglob("*.lock*")]
    print(json.dumps(out))
    """
    src = tmp_path / "src"
    build_index(tiny_encoder, _passages(), src, progress=False)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    disk.mkdir()
    script = script.replace("Path(SRC), Path(DISK), MODEL",
                            f"Path({str(src)!r}), Path({str(disk)!r}), {str(tiny_model_dir)!r}")
    got = _in_namespace(f"mount -t tmpfs -o size={size + 256 * 1024} tmpfs {disk}", script)
    assert got["cli_search"] == 0, got["search_err"]
    assert got["health"] == 200 and got["http_search"] == 200 and got["search_after"] == 200, got
    for write, (status, text) in got["writes"].items():
        assert status == 507, (write, status, text)
        assert "no space left" in text
    code, message = got["cli_compact"]
    assert code != 0 and "no space left" in message.lower() and "Traceback" not in message, got["cli_compact"]
    assert got["delete_after_freeing"][0] == 200, got
