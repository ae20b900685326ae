"""Issue 40: nothing lost, nothing silently wrong — fresh builds locked, a folder proven to be an
index before anything in it is touched, the metadata file checked against a digest."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agrame.corpus import Passage
from agrame.index import Index, IndexFolderError, IndexWriter, build_index
from agrame.index.format import read_manifest
from agrame.index.metadata import MetadataDB
from agrame.index.store import verify_crc
from agrame.index.writer import build_new_folder
from agrame_app.cli import main

from reliability.corpus import TEXTS  # (the probes' corpus: one list for both)


def _passages(tag: str = "p", n: int = len(TEXTS)):
    return [Passage(f"{tag}{i}", TEXTS[i % len(TEXTS)], metadata={"source": "wiki" if i % 2 else "news", "n": i})
            for i in range(n)]


def _snapshot(folder: Path) -> dict:
    """Every entry under a folder with its bytes' hash (folders as None): what 'untouched' means."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def built(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, progress=False)
    return path


def _corpus_file(folder: Path, tag: str, n: int = 30) -> Path:
    file = folder / f"{tag}.jsonl"
    file.write_text("".join(json.dumps({"id": f"{tag}-{i}", "text": f"{TEXTS[i % 6]} Number {i} of {tag}."}) + "\n"
                            for i in range(n)))
    return file


# -- 1. a fresh build holds a lock that exists before the index does ---------------------------

_HOLD_BUILD = textwrap.dedent("""
    import sys, time
    from agrame.index.lock import build_lock
    with build_lock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def test_a_fresh_build_of_a_path_being_built_is_refused_naming_the_builder(tmp_path, tiny_model_dir, capsys):
    target = tmp_path / "new"
    corpus = _corpus_file(tmp_path, "b")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_BUILD, str(target), "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for extra in ([], ["--overwrite"]):
            code = main(["index", "-p", str(corpus), "-i", str(target), "--model", str(tiny_model_dir), *extra])
            err = capsys.readouterr().err
            assert code == 2 and f"being built by process {holder.pid}" in err, err
        assert not target.exists()
    finally:
        holder.wait(timeout=30)
    # the holder gone, its lock file went with it, and a build goes through
    assert main(["index", "-p", str(corpus), "-i", str(target), "--model", str(tiny_model_dir)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl", "new"]


_BUILD = textwrap.dedent("""
    import sys
    from agrame_app.cli import main
    sys.exit(main(["index", "-p", sys.argv[1], "-i", sys.argv[2], "--model", sys.argv[3], *sys.argv[4:]]))
""")


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_concurrent_fresh_builds_lose_nothing_silently(tmp_path, tiny_model_dir, tiny_encoder, overwrite):
    for trial in range(2):
        target = tmp_path / f"x{trial}"
        files = [_corpus_file(tmp_path, tag) for tag in ("a", "b")]
        extra = [[], ["--overwrite"] if overwrite else []]
        procs = [subprocess.Popen([sys.executable, "-c", _BUILD, str(f), str(target), str(tiny_model_dir), *x],
                                  stderr=subprocess.PIPE, text=True) for f, x in zip(files, extra)]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        codes = [c for c, _ in results]
        ids = set(Index(target, model=tiny_encoder).ids())
        if codes == [0, 0]:
            # only when one build ran wholly after the other, and that one was asked to --overwrite
            assert overwrite and ids == {f"b-{i}" for i in range(30)}
            continue
        assert sorted(codes) == [0, 2], results
        winner = "ab"[codes.index(0)]
        loser_err = results[codes.index(2)][1]
        assert ids == {f"{winner}-{i}" for i in range(30)}  # the winner's corpus, whole
        assert "being built by process" in loser_err or "already exists" in loser_err, loser_err
        assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")]


def test_a_path_that_appears_during_a_build_is_left_alone(tmp_path, tiny_encoder):
    target = tmp_path / "ix"

    def write(tmp: Path):
        target.mkdir()  # a writer that takes no build lock (an older version, a copy by hand)
        (target / "theirs.txt").write_text("theirs")
        (tmp / "ours.txt").write_text("ours")
        return None

    with pytest.raises(IndexFolderError, match="appeared while this build ran"):
        build_new_folder(target, False, write)
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ix"]


def test_a_killed_fresh_builds_leftovers_go_with_the_next_build_in_that_folder(tmp_path, tiny_encoder):
    dead = tmp_path / ".other.tmp-999999"  # a killed build of another index beside it
    dead.mkdir()
    (dead / "centroids.f16").write_bytes(b"\0" * 8)
    (dead / "codes.bin").write_bytes(b"\0" * 8)
    users = tmp_path / ".cache.tmp-999998"  # not ours: a file we never write
    users.mkdir()
    (users / "notes.txt").write_text("keep")
    empty = tmp_path / ".blank.tmp-999997"  # nothing in it says whose it is
    empty.mkdir()
    said = []
    build_new_folder(tmp_path / "ix", False, lambda tmp: (tmp / "manifest.json").write_text("{}") and None,
                     say=said.append)
    assert not dead.exists() and any(".other.tmp-999999" in s for s in said)
    assert (users / "notes.txt").read_text() == "keep" and empty.exists()


# -- 2. a folder is an index by its whole layout, never by its manifest alone --------------------

def _user_folder(tmp_path: Path, built: Path, name: str) -> Path:
    folder = tmp_path / name
    (folder / "s1").mkdir(parents=True)
    shutil.copy(built / "manifest.json", folder / "manifest.json")
    (folder / "s1" / "thesis.tex").write_text("\\chapter{Reefs}\n" * 100)
    (folder / "passages.jsonl").write_text("x" * 80_000)
    return folder


@pytest.mark.parametrize("compacted", [False, True])
def test_no_command_touches_a_folder_holding_a_copied_manifest(tmp_path, built, tiny_encoder, tiny_model_dir,
                                                               capsys, compacted):
    if compacted:
        index = Index(built, model=tiny_encoder)
        index.delete(["p1"], compact_threshold=None)
        index.compact()
        assert read_manifest(built)["store"] == "s1/"
    folder = _user_folder(tmp_path, built, "mine")
    before = _snapshot(folder)
    corpus = _corpus_file(tmp_path, "c", 3)
    model = ["--model", str(tiny_model_dir)]
    commands = [["index", "--overwrite", "-p", str(corpus), "-i", str(folder), *model],
                ["index", "--add", "-p", str(corpus), "-i", str(folder), *model],
                ["index", "--upsert", "-p", str(corpus), "-i", str(folder), *model],
                ["delete", "-i", str(folder), "--missing", "ok", "x"],
                ["delete", "-i", str(folder), "--filter", '{"source": "wiki"}'],
                ["compact", "-i", str(folder)],
                ["search", "-i", str(folder), "coral", *model]]
    for argv in commands:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert "not a whole AGRaME index" in err or "not an AGRaME index" in err or "is damaged" in err, (argv, err)
        assert _snapshot(folder) == before, argv
    with pytest.raises(IndexFolderError):
        IndexWriter(folder).__enter__()
    assert _snapshot(folder) == before


def test_recovery_refuses_to_cut_a_longer_file_that_is_not_the_indexs(built, tiny_encoder):
    manifest = read_manifest(built)
    size = manifest["files"]["passages.jsonl"]["size"]
    (built / "passages.jsonl").write_bytes(b"y" * (size + 500))  # same name, longer, other bytes
    before = _snapshot(built)
    with pytest.raises(IndexFolderError, match="passages.jsonl does not match its checksum"):
        IndexWriter(built).__enter__()
    after = _snapshot(built)
    after.pop(".lock")  # the index's own (empty) lock file
    assert after == before


def test_overwrite_and_compaction_keep_a_users_folder_inside_an_index(tmp_path, built, tiny_encoder, tiny_model_dir):
    for name in ("s3", "s1", "notes"):
        (built / name).mkdir()
        (built / name / "thesis.tex").write_text("mine")
    build_index(tiny_encoder, _passages("q", 4), built, progress=False, overwrite=True)
    index = Index(built, model=tiny_encoder)
    assert index.manifest["store"] not in ("s1/", "s3/") and sorted(index.ids()) == ["q0", "q1", "q2", "q3"]
    index.delete(["q0"], compact_threshold=None)
    index.compact()
    for name in ("s3", "s1", "notes"):
        assert (built / name / "thesis.tex").read_text() == "mine"
    assert sorted(Index(built, model=tiny_encoder).ids()) == ["q1", "q2", "q3"]


def test_overwrite_of_a_sharded_index_holding_a_users_files_is_refused(tmp_path, tiny_encoder):
    from agrame.index.sharded import build_sharded

    path = tmp_path / "sh"
    build_sharded(tiny_encoder, _passages(), path, 2, progress=False)
    (path / "s3").mkdir()
    (path / "s3" / "thesis.tex").write_text("mine")
    with pytest.raises(IndexFolderError, match=r"holds files that are not the index's \(s3/\)"):
        build_sharded(tiny_encoder, _passages("q", 4), path, 2, progress=False, overwrite=True)
    assert (path / "s3" / "thesis.tex").read_text() == "mine"


# -- 3. meta.sqlite is covered like every other file ----------------------------------------------

def _flip_at(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _offsets_of(data: bytes, needle: bytes) -> list:
    out, at = [], data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


@pytest.mark.parametrize("needle", [b"wiki", b"news", b"p3", b'"n": 4'])
def test_every_flip_inside_a_stored_value_is_refused_naming_the_file(tmp_path, built, tiny_encoder, needle, capsys):
    meta = built / "meta.sqlite"
    original = meta.read_bytes()
    offsets = _offsets_of(original, needle)
    assert offsets, needle
    for at in offsets:
        meta.write_bytes(original)
        _flip_at(meta, at + len(needle) - 1)
        with pytest.raises(IndexFolderError, match="meta.sqlite"):
            Index(built, model=tiny_encoder)
        code = main(["search", "-i", str(built), "--filter", '{"source": "wiki"}', "coral"])
        assert code == 2 and "meta.sqlite" in capsys.readouterr().err
        with pytest.raises(IndexFolderError, match="meta.sqlite"):
            verify_crc(built)
    meta.write_bytes(original)
    assert len(Index(built, model=tiny_encoder).search("coral", "passage", filter={"source": "wiki"})) == 3


def test_digest_follows_every_commit_and_an_older_index_gains_one(built, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    index.upsert([Passage("p1", "Kelp forests grow fast.",
                          metadata={"source": "kelp", "tags": ["a", 2, True], "w": 2.5}),
                  Passage("z", "Seagrass stores carbon.", metadata={"tags": []})])
    index.delete(["p2"], compact_threshold=None)
    index.delete_where({"source": "news"}, compact_threshold=None)
    manifest = read_manifest(built)
    db = MetadataDB(built / "meta.sqlite")
    assert db.digest(manifest["num_passages"]) == manifest["metadata_digest"]
    db.close()
    index.compact()
    manifest = read_manifest(built)
    db = MetadataDB(built / manifest["store"] / "meta.sqlite")
    assert db.digest(manifest["num_passages"]) == manifest["metadata_digest"]
    db.close()
    # an index written before digests opens, and its next commit records one
    from agrame.index.format import write_manifest

    write_manifest(built, {k: v for k, v in manifest.items() if k != "metadata_digest"})
    index = Index(built, model=tiny_encoder)
    assert index.get("z")["metadata"] == {"tags": []}
    index.upsert([Passage("y", "Dugongs eat seagrass.")])
    assert "metadata_digest" in read_manifest(built)
    Index(built, model=tiny_encoder)


def test_a_writer_refuses_damaged_metadata_before_acting_on_it(built, tiny_encoder):
    meta = built / "meta.sqlite"
    data = meta.read_bytes()
    at = _offsets_of(data, b"wiki")[0]
    _flip_at(meta, at + 3)
    with pytest.raises(IndexFolderError, match="meta.sqlite"):
        with IndexWriter(built) as w:
            w.delete_where({"source": "wiki"})
    assert read_manifest(built)["generation"] == 1


def test_sqlite_structure_damage_is_refused(built, tiny_encoder):
    meta = built / "meta.sqlite"
    data = bytearray(meta.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree header and cells
    meta.write_bytes(bytes(data))
    with pytest.raises(IndexFolderError, match="meta.sqlite"):
        Index(built, model=tiny_encoder)


# -- 4. bounds on every input ------------------------------------------------------------------------

def _wide_and_deep_filters():
    deep = {"a": 1}
    for _ in range(5000):
        deep = {"$not": deep}
    return {"or-992": {"$or": [{"f": i} for i in range(992)]},
            "and-1000": {"$and": [{"f": {"$ne": i}} for i in range(1000)]},
            "25x10000-in": {f"k{j}": {"$in": list(range(10_000))} for j in range(25)},
            "deep-5000": deep}


def test_wide_and_deep_filters_are_refused_before_sql(built, tiny_encoder, capsys):
    from agrame.index.metadata import FilterError, MAX_FILTER_TERMS, compile_filter

    index = Index(built, model=tiny_encoder)
    for name, spec in _wide_and_deep_filters().items():
        text = json.dumps(spec) if name != "deep-5000" else '{"$not": ' * 5000 + '{"a": 1}' + "}" * 5000
        with pytest.raises(FilterError):
            compile_filter(text)
        with pytest.raises(FilterError):
            index.search("coral", "passage", filter=spec if name != "deep-5000" else text)
        for argv in (["search", "-i", str(built), "--filter", text, "coral"],
                     ["delete", "-i", str(built), "--filter", text]):
            code = main(argv)
            err = capsys.readouterr().err
            assert code == 2 and "Traceback" not in err and "filter" in err, (name, err[:300])
    assert read_manifest(built)["generation"] == 1
    # the largest filter within the bounds runs
    ok = {"$or": [{"n": i} for i in range(MAX_FILTER_TERMS - 1)]}
    assert len(index.search("coral", "passage", filter=ok, top_k=10)) == 6


def test_deeply_nested_json_in_every_reader_is_a_clear_error(tmp_path, built, capsys):
    deep = "[" * 5000 + "]" * 5000
    passages = tmp_path / "deep.jsonl"
    passages.write_text(json.dumps({"id": "a", "text": "x"}) + "\n" + '{"id": "b", "text": "y", "metadata": ' + deep + "}\n")
    queries = tmp_path / "deep-queries.jsonl"
    queries.write_text('{"id": "q", "text": "coral", "x": ' + deep + "}\n")
    for argv, where in ((["rank", "-q", "coral", "-p", str(passages)], f"{passages}:2"),
                        (["index", "-p", str(passages), "-i", str(tmp_path / "ix2")], f"{passages}:2"),
                        (["search", "-i", str(built), "--queries", str(queries)], f"{queries}:1")):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and where in err and "nested more than" in err and "Traceback" not in err, err


def test_a_passage_longer_than_the_bound_is_refused_naming_it(tmp_path, capsys):
    from agrame.io import MAX_PASSAGE_CHARS

    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"id": "a", "text": "reef " * 10}) + "\n"
                   + json.dumps({"id": "b", "text": "x" * (MAX_PASSAGE_CHARS + 1)}) + "\n")
    code = main(["index", "-p", str(big), "-i", str(tmp_path / "ix")])
    err = capsys.readouterr().err
    assert code == 2 and f"{big}:2: field 'text': {MAX_PASSAGE_CHARS + 1:,} characters" in err
    assert "--max-passage-chars" in err and not (tmp_path / "ix").exists()
    code = main(["rank", "-q", "reef", "-p", str(big), "--max-passage-chars", "20"])
    assert code == 2 and f"{big}:1: field 'text': 50 characters, at most 20 " in capsys.readouterr().err


@pytest.fixture
def client(built, tiny_model_dir, tiny_encoder):
    from fastapi.testclient import TestClient

    from agrame_app.serve import Limits, create_app

    app = create_app(built, model=str(tiny_model_dir), limits=Limits(max_passages=3, max_passage_chars=1000))
    return TestClient(app, raise_server_exceptions=False)


def test_http_filters_depths_and_bodies_get_4xx_in_the_error_shape(client):
    for name, spec in _wide_and_deep_filters().items():
        if name == "deep-5000":
            body = ('{"query": "coral", "filter": ' + '{"$not": ' * 5000 + '{"a": 1}' + "}" * 5000 + "}").encode()
        else:
            body = json.dumps({"query": "coral", "filter": spec}).encode()
        r = client.post("/search", content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}, (name, r.status_code, r.text[:200])
    r = client.post("/search", content=b'{"query": "\xff coral"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json() == {"error": "body: not valid UTF-8 (at byte 11)"}
    r = client.post("/rank", content=b"[" * 100 + b"]" * 100, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested more than 64 deep" in r.json()["error"]


def test_http_bodies_are_bounded_before_they_are_parsed(client):
    from agrame_app.serve import Limits

    limit = Limits(max_passages=3, max_passage_chars=1000).body_limit("POST", "/search")
    # declared too large: refused before a byte is read
    r = client.post("/search", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "at most" in r.json()["error"] and set(r.json()) == {"error"}

    def chunks():  # streamed without a length: refused once the limit is passed
        for _ in range(limit // 4096 + 2):
            yield b" " * 4096

    r = client.post("/search", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body over" in r.json()["error"]
    rank_limit = Limits(max_passages=3, max_passage_chars=1000).body_limit("POST", "/rank")
    assert rank_limit == 6 * (3 * 1000 + 1000) + (64 << 10)
    ok = client.post("/search", json={"query": "coral", "top_k": 2})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 2


def test_heavy_searches_share_the_gate_and_light_ones_pass(built, tiny_model_dir):
    from fastapi.testclient import TestClient

    from agrame_app.serve import Limits, create_app

    app = create_app(built, model=str(tiny_model_dir), limits=Limits(max_heavy=0))
    client = TestClient(app)
    assert client.post("/search", json={"query": "coral"}).status_code == 200  # light: budget only
    heavy = {"query": "coral", "ncandidates": 8192, "nprobe": 1024, "top_k": 100, "explain": True,
             "granularity": "passage"}
    r = client.post("/search", json=heavy)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "busy" in r.json()["error"]
