"""A living index: delete / upsert / compact by id, metadata filters, one writer at a time, crash safety."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame_app.cli import main
from agrame.corpus import EncodedCorpus, Passage
from agrame.index import (Index, IndexFolderError, IndexLockedError, IndexWriter, UnknownIdsError, build_index,
                          read_manifest, verify_crc)
from agrame.index.metadata import (FieldColumns, FilterError, MetadataDB, MetadataError, compile_filter, matches,
                                   validate_metadata)
from agrame.index.writer import build_compressed

from test_index import TEXTS, _synthetic

REPO = Path(__file__).resolve().parent.parent
LEGACY = Path(__file__).resolve().parent / "data" / "index-v2-2026-11"
QUERIES = ["coral bleaching", "Nobel prize Warsaw", "tower in Paris", "reef tourism boats"]
EXTRA = ["Glaciers retreat as the climate warms. Sea levels rise.",
         "Honey bees pollinate crops. Their colonies collapse under stress.",
         "The Amazon river carries more water than any other. It crosses Brazil."]


def _passages(n: int = 6, meta: bool = True):
    return [Passage(f"p{i}", TEXTS[i % len(TEXTS)] + ("" if i < len(TEXTS) else f" Copy {i}."),
                    metadata={"year": 2000 + i, "source": "wiki" if i % 2 else "news", "tags": ["t", f"g{i % 3}"]}
                    if meta else None) for i in range(n)]


def _hits(index: Index, **kw):
    out = []
    for q in QUERIES:
        for g in ("passage", "sentence"):
            out.append([(h.passage_id, h.start, h.end, round(h.score, 4)) for h in index.search(q, g, top_k=20, **kw)])
    return out


@pytest.fixture
def built(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, progress=False)
    return path


# -- delete, upsert, compact --------------------------------------------------------------------

def test_upsert_equals_a_build_of_the_final_passages(built, tmp_path, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    changed = [Passage("p2", EXTRA[0], metadata={"year": 1999}), Passage("new", EXTRA[1])]
    index.upsert(changed)
    assert len(index) == 7 and index.manifest["generation"] == 2
    assert index.get("p2") == {"id": "p2", "text": EXTRA[0], "metadata": {"year": 1999}}
    final = [p for p in _passages() if p.id != "p2"] + changed
    build_compressed(tiny_encoder, final, tmp_path / "fresh", codec=index.store.codec, progress=False)
    fresh = Index(tmp_path / "fresh", model=tiny_encoder)
    assert _hits(index) == _hits(fresh)
    assert _hits(index, exact=True) == _hits(fresh, exact=True)
    assert sorted(index.ids()) == sorted(p.id for p in final)


def test_delete_then_compact_equals_a_build_without_them(tmp_path, tiny_encoder):
    items, corpus, rng = _synthetic(3, passages=60)
    build_compressed(tiny_encoder, items, tmp_path / "ix", encoded=corpus, progress=False, store_offsets=True)
    index = Index(tmp_path / "ix", model=tiny_encoder)
    gone = sorted(rng.choice(len(items), 12, replace=False).tolist())
    index.delete([items[i].id for i in gone], compact_threshold=None)
    assert len(index) == 48 and index.manifest["num_deleted"] == 12
    keep = [i for i in range(len(items)) if i not in gone]
    sub = EncodedCorpus.build([items[i] for i in keep], [_encoded(corpus, i) for i in keep])
    build_compressed(tiny_encoder, [items[i] for i in keep], tmp_path / "fresh", encoded=sub,
                     codec=index.store.codec, progress=False, store_offsets=True)
    fresh = Index(tmp_path / "fresh", model=tiny_encoder)
    import torch

    q = torch.from_numpy(np.asarray(corpus.vectors[corpus.passage_tokens(keep[0])])[:4])
    for g in ("passage", "sentence"):
        for kw in ({"exact": True}, {"nprobe": 1, "ncandidates": 16}):
            deleted_view = index.search_vectors(q, q, g, top_k=10, **kw)
            assert len(deleted_view) == 10 and not {h.passage_id for h in deleted_view} & {items[i].id for i in gone}
    before = sum(f.stat().st_size for f in (tmp_path / "ix").rglob("*") if f.is_file())
    index.compact()
    after = sum(f.stat().st_size for f in (tmp_path / "ix").rglob("*") if f.is_file())
    assert after < before and index.manifest["num_passages"] == 48 and "tombstones" not in index.manifest
    root, fresh_root = index.store.root, tmp_path / "fresh"
    for name in ("codes.bin", "residuals.bin", "doclens.bin", "sentences.bin", "tokens.bin", "passages.jsonl"):
        assert (root / name).read_bytes() == (fresh_root / name).read_bytes(), name
    assert np.array_equal(index.store.ivf.offsets, fresh.store.ivf.offsets)  # (the lists derived from those codes)
    assert np.array_equal(index.store.ivf.pids, fresh.store.ivf.pids)
    for g in ("passage", "sentence"):
        a = index.search_vectors(q, q, g, top_k=10, exact=True)
        assert a == fresh.search_vectors(q, q, g, top_k=10, exact=True)
    verify_crc(tmp_path / "ix")


def _encoded(corpus: EncodedCorpus, p: int):
    from agrame.encoder import EncodedPassage

    sl = corpus.passage_tokens(p)
    return EncodedPassage(corpus.vectors[sl], corpus.offsets[sl])


def test_search_still_fills_top_k_after_deletes(built, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    index.delete(["p0", "p2", "p3"], compact_threshold=None)
    for kw in ({}, {"nprobe": 1, "ncandidates": 1}, {"exact": True}):
        hits = index.search("coral bleaching", "passage", top_k=3, **kw)
        assert sorted(h.passage_id for h in hits) == ["p1", "p4", "p5"]
        assert len(index.search("coral bleaching", "passage", top_k=10, **kw)) == 3


def test_unknown_ids_are_an_error_unless_missing_ok(built, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    with pytest.raises(UnknownIdsError, match="'nope'"):
        index.delete(["p1", "nope"])
    assert len(index) == 6  # nothing deleted
    index.delete(["p1", "nope"], missing="ok")
    assert len(index) == 5 and index.get("p1") is None
    with pytest.raises(IndexFolderError, match="already in"):
        index.add([Passage("p2", "again")])


def test_automatic_compaction_past_the_threshold(built, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    index.delete(["p0"], compact_threshold=0.2)  # 1/6 dead: kept
    assert index.manifest["num_deleted"] == 1 and "store" not in index.manifest
    index.delete(["p1"], compact_threshold=0.2)  # 2/6 dead: compacted into s1/
    assert index.manifest["store"] == "s1/" and index.manifest.get("num_deleted", 0) == 0
    assert len(index) == 4 and not (built / "codes.bin").exists()
    assert sorted(index.ids()) == ["p2", "p3", "p4", "p5"]


def test_readers_keep_their_generation_until_they_reload(built, tiny_encoder):
    reader = Index(built, model=tiny_encoder)
    before = _hits(reader)
    writer = Index(built, model=tiny_encoder)
    writer.delete(["p0", "p1", "p2"])  # compacts: the reader's files are unlinked
    assert not (built / "codes.bin").exists()
    assert _hits(reader) == before  # its memory maps keep the old generation
    assert reader.reload() and len(reader) == 3


# -- metadata and filters --------------------------------------------------------------------

def test_filtered_search_returns_top_k_matching(built, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    assert index.metadata("p3") == {"year": 2003, "source": "wiki", "tags": ["t", "g0"]}
    for spec, expected in [({"source": "wiki"}, {"p1", "p3", "p5"}), ({"year": {"$gte": 2004}}, {"p4", "p5"}),
                           ({"tags": "g0"}, {"p0", "p3"}), ({"$not": {"tags": {"$in": ["g1", "g2"]}}}, {"p0", "p3"}),
                           ({"year": {"$lt": 2000}}, set()), ({"missing": {"$exists": False}}, {f"p{i}" for i in range(6)})]:
        for kw in ({}, {"nprobe": 1, "ncandidates": 1}, {"exact": True}):
            hits = index.search("coral bleaching", "passage", top_k=10, filter=spec, **kw)
            assert {h.passage_id for h in hits} == expected, (spec, kw)
        assert {h.passage_id for h in index.search("reef", "passage", top_k=2, filter=spec)} <= expected
        assert len(index.search("reef", "passage", top_k=2, filter=spec)) == min(2, len(expected))
    staged = index.search("coral bleaching", "sentence", top_k=1, filter={"source": "news"})
    exact = index.search("coral bleaching", "sentence", top_k=1, filter={"source": "news"}, exact=True)
    # (exact mode scores in float64, rounded once: equal to float32 rounding)
    assert [(h.passage_id, h.start, h.end) for h in staged] == [(h.passage_id, h.start, h.end) for h in exact]
    assert staged[0].score == pytest.approx(exact[0].score, abs=1e-5)
    with pytest.raises(FilterError, match=r"unknown operator '\$regex'"):
        index.search("coral", filter={"source": {"$regex": "w.*"}})


def test_filter_on_an_index_that_predates_metadata(tmp_path, tiny_encoder):
    shutil.copytree(LEGACY, tmp_path / "old")
    index = Index(tmp_path / "old", model=tiny_encoder)
    assert index.search("coral bleaching", "passage", top_k=3, filter={"x": {"$exists": False}})
    assert index.search("coral bleaching", "passage", top_k=3, filter={"x": 1}) == []


_keys = st.sampled_from(["a", "b", "tags", "x'; DROP TABLE passages; --"])
_scalars = st.one_of(st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, -1.5]),
                     st.sampled_from(["", "u", "v", "w", "' OR 1=1 --", "a\"b"]))
_metas = st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=3)


def _leaf():
    ops = st.one_of(
        st.builds(lambda v: v, _scalars),
        st.builds(lambda v: {"$eq": v}, _scalars), st.builds(lambda v: {"$ne": v}, _scalars),
        st.builds(lambda v: {"$in": v}, st.lists(_scalars, max_size=3)),
        st.builds(lambda v: {"$nin": v}, st.lists(_scalars, max_size=3)),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]),
                  st.one_of(st.integers(-3, 3), st.sampled_from(["u", "v", ""]))),
        st.builds(lambda v: {"$exists": v}, st.booleans()))
    return st.builds(lambda k, cond: {k: cond}, _keys, ops)


_filters = st.recursive(_leaf(), lambda inner: st.one_of(
    st.builds(lambda xs: {"$and": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda x: {"$not": x}, inner)), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(metas=st.lists(_metas, min_size=1, max_size=12), spec=_filters)
def test_filter_sql_agrees_with_plain_python(tmp_path_factory, metas, spec):
    folder = tmp_path_factory.mktemp("meta")
    db = MetadataDB(folder / "m.sqlite", writable=True, create=True)
    try:
        db.insert((i, f"p{i}", validate_metadata(m)) for i, m in enumerate(metas))
        got = db.positions(spec, len(metas)).tolist()
        assert got == [i for i, m in enumerate(metas) if matches(m, spec)]
    finally:
        db.close()


@settings(max_examples=300, deadline=None)
@given(metas=st.lists(_metas, min_size=1, max_size=12), spec=_filters)
def test_filter_columns_agree_with_plain_python(metas, spec):
    """The vectorised evaluation a verified reader answers filters with (FieldColumns) against the naive loop."""
    metas = [validate_metadata(m) for m in metas]
    columns = FieldColumns(((i, m) for i, m in enumerate(metas) if m), len(metas))
    assert np.flatnonzero(columns.mask(spec)).tolist() == [i for i, m in enumerate(metas) if matches(m, spec)]


def test_filter_columns_agree_with_plain_python_on_every_leaf():
    """Every operator × every operand × every stored value, one leaf at a time (random filters rarely hit a
    boundary such as $gt on an equal value)."""
    values = [True, False, -1, 0, 0.5, 1, 2, "", "u", "uv", "v", "Ü"]
    metas = [{"k": v} for v in values] + [{"k": [v, "w"]} for v in values] + [{"k": []}, {}, {"other": 1}]
    columns = FieldColumns(((i, m) for i, m in enumerate(metas) if m), len(metas))
    for op in ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$exists", "$in", "$nin"):
        for operand in ([v for v in values if not isinstance(v, bool)] if op.startswith(("$gt", "$lt")) else
                        values if op not in ("$exists", "$in", "$nin") else
                        [True, False] if op == "$exists" else [[], [0, "u"], [True, 1, "v"]]):
            spec = {"k": {op: operand}}
            assert np.flatnonzero(columns.mask(spec)).tolist() == \
                [i for i, m in enumerate(metas) if matches(m, spec)], spec


def test_metadata_of_many_ids_in_one_query_equals_the_lookup_of_each(tmp_path, tiny_encoder):
    """Hits' metadata come from one query by id (the newest live copy of each); a naive loop over
    position_of and the row of that position is the reference, after random upserts and deletes."""
    rng = random.Random(7)
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(8), path, progress=False)
    for step in range(6):
        with IndexWriter(path, compact_threshold=None) as w:
            ids = rng.sample([f"p{i}" for i in range(8)], 3)
            if step % 3 == 2:
                w.delete(ids, missing="ok")
            else:
                w.upsert(tiny_encoder, [Passage(pid, f"{TEXTS[step]} v{step}", metadata={"v": step, "id": pid})
                                        for pid in ids])
        store = Index(path, model=tiny_encoder).store
        asked = [f"p{i}" for i in range(10)]  # p8, p9 were never added
        naive = {pid: store.metadata(pos) for pid, pos in store.position_of(asked).items()}
        assert store.metadata_by_id(asked) == naive
        assert any(m.get("v") == step for m in naive.values()) == (step % 3 != 2)


def test_injection_strings_are_data(tmp_path):
    evil = "x'); DROP TABLE passages; --"
    db = MetadataDB(tmp_path / "m.sqlite", writable=True, create=True)
    db.insert([(0, evil, {evil: evil, "k": [evil]}), (1, "ok", {"k": "v"})])
    assert db.positions({evil: evil}, 2).tolist() == [0]
    assert db.positions({"k": {"$in": [evil, "v"]}}, 2).tolist() == [0, 1]
    sql, params = compile_filter({evil: {"$gt": evil}})
    assert evil not in sql and evil in params
    assert db.positions_of([evil], 2) == {evil: [0]} and db.count() == 2
    db.check()


def test_bad_metadata_and_filters_name_the_place(tmp_path):
    with pytest.raises(MetadataError, match=r"metadata.year: numbers must be finite"):
        validate_metadata({"year": float("nan")})
    with pytest.raises(MetadataError, match=r"metadata.o: expected a string, number or boolean, got dict"):
        validate_metadata({"o": {"nested": 1}})
    with pytest.raises(MetadataError, match="null"):
        validate_metadata({"n": None})
    with pytest.raises(FilterError, match=r"filter.year.\$in: expected a list"):
        compile_filter({"year": {"$in": 3}})
    with pytest.raises(FilterError, match="not valid JSON"):
        compile_filter("{year: 3}")
    with pytest.raises(FilterError, match="compare numbers or strings"):
        compile_filter({"flag": {"$gt": True}})
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "text": "x", "metadata": {"tags": [1, {"y": 2}]}}\n')
    code = main(["index", "-p", str(bad), "-i", str(tmp_path / "ix")])
    assert code == 2 and not (tmp_path / "ix").exists()


# -- one writer at a time --------------------------------------------------------------------

_HOLD = textwrap.dedent("""
    import sys, time
    from agrame.index import IndexWriter
    with IndexWriter(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def test_a_second_writer_is_refused_or_waits(built, tiny_encoder, capsys, tiny_model_dir):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(built), "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(IndexLockedError, match=f"process {holder.pid}"):
            IndexWriter(built).__enter__()
        code = main(["delete", "-i", str(built), "p1"])
        assert code == 2 and f"process {holder.pid}" in capsys.readouterr().err
        started = time.monotonic()
        Index(built, model=tiny_encoder).delete(["p1"], lock_timeout=30)  # waits for the holder
        assert time.monotonic() - started > 0.5
    finally:
        holder.wait(timeout=30)
    assert Index(built, model=tiny_encoder).get("p1") is None


_ADD = textwrap.dedent("""
    import sys
    from agrame.corpus import Passage
    from agrame.loading import load_encoder
    from agrame.index import IndexWriter
    enc = load_encoder(sys.argv[2])
    with IndexWriter(sys.argv[1], lock_timeout=60) as w:
        w.add(enc, [Passage(f"{sys.argv[3]}-{i}", "Text number %d about reefs." % i) for i in range(20)])
""")


def test_two_concurrent_adds_lose_nothing(built, tiny_model_dir, tiny_encoder):
    procs = [subprocess.Popen([sys.executable, "-c", _ADD, str(built), str(tiny_model_dir), tag]) for tag in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ids = set(Index(built, model=tiny_encoder).ids())
    assert {f"{t}-{i}" for t in "ab" for i in range(20)} <= ids and len(ids) == 46
    assert read_manifest(built)["generation"] == 3


# -- crash safety --------------------------------------------------------------------------------

def test_kill_9_loop_leaves_before_or_after(tmp_path, tiny_model_dir, monkeypatch):
    from reliability import fault

    monkeypatch.chdir(REPO)
    from agrame.loading import load_encoder

    enc = load_encoder(str(tiny_model_dir))
    rng = random.Random(0)
    build_index(enc, [Passage(f"p{i}", t, metadata=fault._metadata(rng)) for i, t in enumerate(TEXTS)],
                tmp_path / "ix", progress=False)
    result = fault.run(tmp_path / "ix", str(tiny_model_dir), EXTRA + TEXTS, kills=5, seed=1, size=2,
                       log=lambda _: None, durations={op: 1.0 for op in fault.OPS})
    assert result["failures"] == [] and result["totals"]["other"] == 0
    assert result["totals"]["kills"] == 5


def test_recovery_removes_what_a_dead_writer_left(built, tiny_encoder):
    (built / ".codes.bin.tmp-999999").write_bytes(b"x")
    (built / "ivf-7.pids.bin").write_bytes(b"x")
    (built / "s9").mkdir()
    (built / "s9" / "codes.bin").write_bytes(b"x")
    with open(built / "codes.bin", "ab") as f:
        f.write(b"uncommitted")
    (built.parent / f".{built.name}.tmp-999999").mkdir()
    (built.parent / f".{built.name}.tmp-999999" / "centroids.f16").write_bytes(b"x")  # what a build writes first
    (built / "notes.txt").write_text("a user's file is never touched")
    said = []
    with IndexWriter(built, say=said.append) as w:
        removed = w.recovered
    assert {".codes.bin.tmp-999999", "ivf-7.pids.bin", "s9/", f"../.{built.name}.tmp-999999/"} <= set(removed)
    assert "codes.bin: 11 uncommitted bytes" in removed and said  # the bytes cut, counted before the cut
    assert (built / "notes.txt").exists() and not (built / "s9").exists()
    verify_crc(built)


def test_overwrite_replaces_only_an_index(tmp_path, tiny_encoder, coral_file, capsys):
    notidx = tmp_path / "notidx"
    notidx.mkdir()
    (notidx / "thesis.txt").write_text("draft")
    code = main(["index", "--overwrite", "-p", str(coral_file), "-i", str(notidx)])
    assert code == 2 and "is not an AGRaME index" in capsys.readouterr().err
    assert (notidx / "thesis.txt").read_text() == "draft"
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, progress=False)
    build_index(tiny_encoder, _passages(3), path, progress=False, overwrite=True)
    index = Index(path, model=tiny_encoder)
    assert len(index) == 3 and index.manifest["generation"] == 2 and index.manifest["store"] == "s1/"
    assert sorted(p.name for p in path.iterdir()) == [".lock", "manifest.json", "s1"]
    # An index an earlier version left aside (killed mid --overwrite) is put back, not dropped.
    aside = tmp_path / ".ix.old-4242"
    path.rename(aside)
    with pytest.raises(IndexFolderError, match=r"left an index aside as .*\.ix\.old-4242"):
        Index(path, model=tiny_encoder)
    index = Index(aside, model=tiny_encoder)
    IndexWriter(path).__enter__().__exit__()
    assert Index(path, model=tiny_encoder).ids() == ["p0", "p1", "p2"] and not aside.exists()


def test_an_index_written_before_this_change_opens_and_changes(tmp_path, tiny_encoder):
    shutil.copytree(LEGACY, tmp_path / "old")
    index = Index(tmp_path / "old", model=tiny_encoder)
    assert len(index) == 6 and index.search("coral bleaching", "sentence", top_k=3)
    before = _hits(index)
    index.upsert([Passage("p9", EXTRA[0], metadata={"k": 1})])
    index.delete(["p5"], compact_threshold=None)
    assert index.get("p9")["metadata"] == {"k": 1} and index.get("p5") is None
    assert index.search("glaciers", "passage", top_k=1, filter={"k": 1})[0].passage_id == "p9"
    assert not (tmp_path / "old" / "ivf-1.pids.bin").exists()  # superseded files go with the next write
    verify_crc(tmp_path / "old")
    assert len(before) == len(QUERIES) * 2
    # its inverted file keeps its int32 passages through the writes (the format an older reader knows)
    m = index.manifest
    assert "ivf_pids" not in m
    g = m["ivf_generation"]
    assert m["files"][f"ivf-{g}.pids.bin"]["size"] == 4 * int(index.store.ivf.offsets[-1])
    index.compact()
    assert "ivf_pids" not in index.manifest and index.search("glaciers", "passage", top_k=1)[0].passage_id == "p9"


def _naive_lists(store) -> list:
    """Each centroid's list written out: the passages holding one of its tokens, in order."""
    return [[p for p in range(len(store)) if c in set(store.codes[store.starts[p]:store.starts[p + 1]].tolist())]
            for c in range(store.codec.num_centroids)]


def _lists(store) -> list:
    return [store.ivf.pids[store.ivf.offsets[c]:store.ivf.offsets[c + 1]].tolist()
            for c in range(store.codec.num_centroids)]


def test_a_new_index_derives_its_lists_from_its_codes(built, tmp_path, tiny_encoder):
    index = Index(built, model=tiny_encoder)
    assert index.manifest["ivf_pids"] == "derived"
    assert not any(n.startswith("ivf-") for n in index.manifest["files"]) and not list(built.glob("ivf-*"))
    assert _lists(index.store) == _naive_lists(index.store)
    index.upsert([Passage("p9", EXTRA[0])])
    index.delete(["p0"], compact_threshold=None)
    assert _lists(index.store) == _naive_lists(index.store)
    index.compact()
    assert index.manifest["ivf_pids"] == "derived" and not list(index.store.root.glob("ivf-*"))
    assert _lists(index.store) == _naive_lists(index.store)
    assert index.search("glaciers", "passage", top_k=1)[0].passage_id == "p9"
    verify_crc(built)


def test_an_index_with_varint_lists_keeps_them_through_its_changes(tmp_path, tiny_encoder, monkeypatch):
    import agrame.index.store as store_module

    monkeypatch.setattr(store_module, "NEW_IVF_PIDS", "varint")  # (what a build wrote from 2026-11-29 to 12-01)
    build_index(tiny_encoder, _passages(6), tmp_path / "v", progress=False)
    monkeypatch.undo()
    index = Index(tmp_path / "v", model=tiny_encoder)
    assert index.manifest["ivf_pids"] == "varint"
    pairs = int(index.store.ivf.offsets[-1])
    assert index.manifest["files"]["ivf-1.pids.bin"]["size"] < 4 * pairs  # (6 passages: a byte each)
    index.upsert([Passage("p9", EXTRA[0])])
    index.delete(["p0"], compact_threshold=None)
    assert index.manifest["ivf_pids"] == "varint" and _lists(index.store) == _naive_lists(index.store)
    index.compact()
    g = index.manifest["ivf_generation"]
    assert index.manifest["ivf_pids"] == "varint" and f"ivf-{g}.pids.bin" in index.manifest["files"]
    assert _lists(index.store) == _naive_lists(index.store)
    verify_crc(tmp_path / "v")


def test_codes_that_name_no_centroid_are_a_damaged_index(built, tmp_path, tiny_encoder):
    import shutil

    from agrame.index.format import crc32_file, write_manifest

    copy = tmp_path / "bad"
    shutil.copytree(built, copy)
    m = json.loads((copy / "manifest.json").read_text())
    codes = np.fromfile(copy / "codes.bin", dtype=m["code_dtype"])
    codes[3] = m["num_centroids"]  # out of range, with its CRC made to match: only the range check can tell
    codes.tofile(copy / "codes.bin")
    m["files"]["codes.bin"]["crc32"] = crc32_file(copy / "codes.bin")
    write_manifest(copy, m)
    with pytest.raises(IndexFolderError, match="damaged.*centroid"):
        Index(copy, model=tiny_encoder)


# -- command line ----------------------------------------------------------------------------

def test_cli_upsert_delete_compact_and_filter(tmp_path, tiny_model_dir, capsys):
    corpus = tmp_path / "p.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "text": p.text, "metadata": p.metadata}) + "\n"
                              for p in _passages()))
    ix = str(tmp_path / "ix")
    assert main(["index", "-p", str(corpus), "-i", ix, "-m", str(tiny_model_dir)]) == 0
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "p1", "text": EXTRA[2], "metadata": {"year": 1900}}) + "\n")
    assert main(["index", "--upsert", "-p", str(more), "-i", ix]) == 0
    assert "upserted 1 passages" in capsys.readouterr().err
    assert main(["search", "-i", ix, "-g", "passage", "-f", "jsonl", "--filter", '{"year": {"$lt": 1950}}',
                 "Amazon river"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["passage_id"] for r in rows] == ["p1"]
    assert main(["delete", "-i", ix, "p0", "zz"]) == 2
    assert "no passage with id 'zz'" in capsys.readouterr().err
    ids = tmp_path / "ids.txt"
    ids.write_text("p0\nzz\n")
    assert main(["delete", "-i", ix, "--ids-file", str(ids), "--missing", "ok", "--compact-threshold", "1"]) == 0
    assert "deleted 1 passages" in capsys.readouterr().err
    assert main(["delete", "-i", ix, "--filter", '{"source": "news"}', "--compact-threshold", "1"]) == 0
    assert "deleted 2 passages" in capsys.readouterr().err  # p2, p4 (p0 is gone already)
    assert main(["compact", "-i", ix]) == 0
    assert "4 deleted passages removed" in capsys.readouterr().err  # p0, p1's old copy, p2, p4
    assert main(["search", "-i", ix, "--filter", "{bad", "reef"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["delete", "-i", ix]) == 2
    assert sorted(Index(ix).ids()) == ["p1", "p3", "p5"]


def test_a_replaced_generation_is_freed_without_a_cycle_collection(built, tiny_encoder):
    """A server reopens a generation per write: the old one (memory maps, SQLite connection) must go
    as soon as nothing uses it, not at the next full garbage collection (a cycle kept 40 of them)."""
    import gc
    import weakref

    gc.disable()
    try:
        index = Index(built, model=tiny_encoder)
        index.search("coral", "sentence")
        old_index, old_store = weakref.ref(index), weakref.ref(index.store)
        del index
        assert old_index() is None and old_store() is None
    finally:
        gc.enable()
