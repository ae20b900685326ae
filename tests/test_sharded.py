"""Sharded indexes: one codec, id routing, exact search equal to the single index, journaled changes."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from agrame.corpus import Passage
from agrame.index import Index, IndexFolderError, UnknownIdsError, build_index
from agrame.index.sharded import (JOURNAL, SHARDS_FILE, ShardedIndex, ShardedWriter, build_sharded, merge_hits,
                                  open_index, read_shards, route, shard_of)
from agrame.index.writer import build_compressed
from agrame.ranker import ScoredSpan
from agrame_app.cli import main

from test_lifecycle import EXTRA, QUERIES, _passages


def _many(n: int = 24):
    return [Passage(f"id-{i}", f"Item {i} of {n}: " + p.text, metadata={"n": i, "even": i % 2 == 0})
            for i, p in enumerate(_passages(n))]


def _hits(index, **kw):
    return [[(h.passage_id, h.start, h.end, round(h.score, 4)) for h in index.search(q, g, top_k=8, **kw)]
            for q in QUERIES for g in ("passage", "sentence")]


@pytest.fixture
def pair(tmp_path, tiny_encoder):
    """A 3-shard index and a single index of the same passages with the same codec."""
    passages = _many()
    build_sharded(tiny_encoder, passages, tmp_path / "sh", 3, progress=False, chunk_passages=4)
    sharded = ShardedIndex(tmp_path / "sh", model=tiny_encoder)
    codec = sharded.shards[0].store.codec
    build_compressed(tiny_encoder, passages, tmp_path / "one", codec=codec, progress=False, chunk_passages=4)
    return sharded, Index(tmp_path / "one", model=tiny_encoder), passages


def test_routing_is_stable_and_spreads():
    assert shard_of("id-1", 8) == shard_of("id-1", 8)  # no per-process salt: a fixed value below
    assert [shard_of(f"x{i}", 4) for i in range(8)] == [shard_of(f"x{i}", 4) for i in range(8)]
    assert shard_of("", 5) in range(5) and shard_of("é✓", 3) in range(3)
    counts = np.bincount([shard_of(str(i), 8) for i in range(8000)], minlength=8)
    assert counts.min() > 850 and counts.max() < 1150
    assert shard_of("id-1", 8) == int.from_bytes(__import__("hashlib").blake2b(b"id-1", digest_size=8).digest(),
                                                 "little") % 8


def test_every_passage_lives_in_its_routed_shard(pair):
    sharded, _, passages = pair
    for s, shard in enumerate(sharded.shards):
        assert all(shard_of(pid, 3) == s for pid in shard.ids())
    assert sorted(sharded.ids()) == sorted(p.id for p in passages) and len(sharded) == len(passages)
    codecs = [s.store.codec for s in sharded.shards]
    assert all(np.array_equal(c.centroids, codecs[0].centroids) for c in codecs)
    assert read_shards(sharded.path)["num_shards"] == 3


def test_exact_sharded_search_equals_single_index(pair):
    sharded, single, _ = pair
    assert _hits(sharded, exact=True) == _hits(single, exact=True)
    # Staged: each shard keeps its own candidates, so the merged top hit is at least as good.
    for a, b in zip(_hits(sharded), _hits(single, exact=True)):
        assert a[0][3] >= b[0][3] - 1e-4 or a[0] == b[0]


def test_filter_and_get_route(pair):
    sharded, single, _ = pair
    spec = {"even": True}
    assert _hits(sharded, exact=True, filter=spec) == _hits(single, exact=True, filter=spec)
    assert all(int(h.passage_id.split("-")[1]) % 2 == 0 for h in sharded.search("coral", "passage", 30, filter=spec))
    assert sharded.get("id-5")["metadata"] == {"n": 5, "even": False} and sharded.get("nope") is None
    ranked = sharded.rank_ids("coral bleaching", ["id-1", "id-2", "id-3", "id-7"], "passage", top_k=None)
    assert sorted(h.passage_id for h in ranked) == ["id-1", "id-2", "id-3", "id-7"]
    assert [h.score for h in ranked] == sorted((h.score for h in ranked), reverse=True)
    with pytest.raises(ValueError, match="filter"):
        sharded.search("coral", filter={"$bad": 1})


def test_delete_upsert_add_route_by_id(pair, tmp_path, tiny_encoder):
    sharded, _, passages = pair
    sharded.delete(["id-0", "id-5"], compact_threshold=None)
    assert sharded.get("id-0") is None and len(sharded) == 22
    with pytest.raises(UnknownIdsError, match="nope"):
        sharded.delete(["id-1", "nope"])
    assert sharded.get("id-1") is not None
    changed = [Passage("id-2", EXTRA[0], metadata={"n": -1}), Passage("new-1", EXTRA[1]), Passage("new-2", EXTRA[2])]
    sharded.upsert(changed)
    assert sharded.get("id-2")["text"] == EXTRA[0] and len(sharded) == 24
    with pytest.raises(IndexFolderError, match="already in"):
        sharded.add([Passage("new-1", "again"), Passage("new-3", "fresh")])
    assert sharded.get("new-3") is None  # an add that fails adds nothing
    for s, shard in enumerate(sharded.shards):
        assert all(shard_of(pid, 3) == s for pid in shard.ids())
    final = [p for p in passages if p.id not in ("id-0", "id-5", "id-2")] + changed
    build_compressed(tiny_encoder, final, tmp_path / "fresh", codec=sharded.shards[0].store.codec, progress=False)
    assert _hits(sharded, exact=True) == _hits(Index(tmp_path / "fresh", model=tiny_encoder), exact=True)
    sharded.delete_where({"n": {"$lt": 10}})
    assert sorted(sharded.ids()) == sorted(p.id for p in final if p.metadata and p.metadata.get("n", 0) >= 10
                                            or not p.metadata)
    assert not (sharded.path / JOURNAL).exists()


def test_an_unfinished_journal_is_reapplied(pair, tiny_encoder):
    sharded, _, _ = pair
    # A writer that died after writing its journal and before (or while) applying it.
    entry = {"op": "upsert", "passages": [{"id": "late", "text": EXTRA[0], "metadata": {"k": 1}},
                                          {"id": "id-3", "text": EXTRA[1]}]}
    (sharded.path / JOURNAL).write_text(json.dumps(entry))
    with ShardedWriter(sharded.path, model=tiny_encoder) as w:
        assert w.replayed
    sharded.reload()
    assert sharded.get("late")["metadata"] == {"k": 1} and sharded.get("id-3")["text"] == EXTRA[1]
    assert not (sharded.path / JOURNAL).exists()
    (sharded.path / JOURNAL).write_text('{"op": "del')  # torn: never committed, so never applied
    with ShardedWriter(sharded.path, model=tiny_encoder) as w:
        assert not w.replayed
    assert len(ShardedIndex(sharded.path, model=tiny_encoder)) == 25


def test_merge_hits_orders_by_score():
    a = [ScoredSpan("a", 0, 1, 3.0, 0, 0, ""), ScoredSpan("b", 0, 1, 1.0, 0, 0, "")]
    b = [ScoredSpan("c", 0, 1, 2.0, 0, 0, ""), ScoredSpan("d", 0, 1, 0.5, 0, 0, "")]
    assert [h.passage_id for h in merge_hits([a, b], 3)] == ["a", "c", "b"]
    assert [h.passage_id for h in merge_hits([a, b], None)] == ["a", "c", "b", "d"]


def test_damaged_shards_manifest_is_named(pair):
    sharded, _, _ = pair
    text = (sharded.path / SHARDS_FILE).read_text()
    (sharded.path / SHARDS_FILE).write_text(text.replace('"num_shards": 3', '"num_shards": 4'))
    with pytest.raises(IndexFolderError, match="shards.json"):
        ShardedIndex(sharded.path)


def test_cli_builds_searches_and_changes_a_sharded_index(tmp_path, tiny_model_dir, coral_file, capsys):
    ix = tmp_path / "cli-sh"
    assert main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--shards", "2"]) == 0
    assert read_shards(ix)["num_shards"] == 2 and isinstance(open_index(ix), ShardedIndex)
    capsys.readouterr()
    assert main(["search", "coral bleaching", "-i", str(ix), "-g", "passage", "--format", "jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines and all("passage_id" in x for x in lines)
    first = lines[0]["passage_id"]
    assert main(["delete", "-i", str(ix), first]) == 0
    assert ShardedIndex(ix).get(first) is None
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "zz", "text": EXTRA[0]}) + "\n")
    assert main(["index", "--add", "-p", str(extra), "-i", str(ix)]) == 0
    assert ShardedIndex(ix).get("zz")["text"] == EXTRA[0]
    assert main(["compact", "-i", str(ix)]) == 0
    assert main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--shards", "3",
                 "--overwrite"]) == 0
    assert read_shards(ix)["num_shards"] == 3
    with pytest.raises(SystemExit) as exit_:
        main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--shards", "0"])
    assert exit_.value.code == 2
    assert main(["index", "--add", "-p", str(extra), "-i", str(ix), "--shards", "2"]) == 2
    assert "--shards and --ray build a new index" in capsys.readouterr().err


def test_ray_flag_without_ray_says_how_to_install(monkeypatch, tmp_path, coral_file, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the extra looks like
    assert main(["index", "-p", str(coral_file), "-i", str(tmp_path / "x"), "--ray"]) == 2
    assert "pip install 'agrame[ray]'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["index", "-p", str(coral_file), "-i", str(tmp_path / "x"), "--workers", "2"]) == 2
    assert "--workers and --resume go with --ray" in capsys.readouterr().err


def test_exact_search_is_bit_identical_at_any_shard_count_with_ties(tmp_path, tiny_encoder):
    """Issue 41, item 5: exact mode returns exactly the single index's top-k — same passages, order and
    float scores — for S = 2, 3, 5, 8. Duplicated texts under other ids tie exactly: ties go by passage id
    wherever they are stored; scores do not depend on the batch a passage is scored in."""
    base = _many(40)
    passages = base + [Passage(f"dup-{i}", base[i].text) for i in range(0, 40, 3)]
    single_path = tmp_path / "one"
    build_compressed(tiny_encoder, passages, single_path, progress=False, chunk_passages=7)
    single = Index(single_path, model=tiny_encoder)
    queries = QUERIES + [p.text.split(":")[1][:40] for p in base[:12]]

    def key(index, q, g):
        return [(h.passage_id, h.start, h.end, h.score) for h in index.search(q, g, top_k=10, exact=True)]

    want = {(q, g): key(single, q, g) for q in queries for g in ("passage", "sentence")}
    assert any(len({h[3] for h in hits}) < len(hits) for hits in want.values()), "no tie was tested"
    for shards in (2, 3, 5, 8):
        build_sharded(tiny_encoder, passages, tmp_path / f"sh{shards}", shards, codec=single.store.codec,
                      progress=False, chunk_passages=5)
        sharded = ShardedIndex(tmp_path / f"sh{shards}", model=tiny_encoder)
        got = {(q, g): key(sharded, q, g) for q in queries for g in ("passage", "sentence")}
        assert got == want, shards


def test_sharded_staged_search_runs_the_single_index_search(tmp_path, tiny_encoder, monkeypatch):
    """Issue 41, item 5, and issue 64: S shards that share a codec search as one index would — the query
    meets the centroids once, the probed centroids are chosen once, every stage's cut is made over the
    whole — so they score exactly the single index's candidates, in one exact stage over their parts
    joined, and return its hits."""
    from agrame.index import search as search_module
    from agrame.index.search import shard_budget

    assert shard_budget(256, 1.0) == 256 and shard_budget(256, 0.5) == 128 + 25
    assert shard_budget(4, 0.01) == 2 and shard_budget(1, 0.3) == 1
    for n in (10, 100, 1000):
        for share in (0.05, 0.125, 0.25, 0.5):
            assert n * share <= shard_budget(n, share) <= n
    # Passages of distinct random words: _many's share their sentences, so their centroid scores tie at
    # every cut, and a tie is cut by where a passage is stored (these have none at a cut).
    words = sorted({w.lower() for p in _passages(40) for w in re.findall(r"[A-Za-z]+", p.text)})
    rng = random.Random(0)
    passages = [Passage(f"id-{i}", " ".join(rng.choice(words) for _ in range(12)).capitalize() + ". "
                        + " ".join(rng.choice(words) for _ in range(9)) + ".", metadata={"n": i, "even": i % 2 == 0})
                for i in range(60)]
    build_sharded(tiny_encoder, passages, tmp_path / "sh", 4, progress=False, chunk_passages=8)
    sharded = ShardedIndex(tmp_path / "sh", model=tiny_encoder)
    single_path = tmp_path / "one"
    build_compressed(tiny_encoder, passages, single_path, codec=sharded.shards[0].store.codec, progress=False)
    single = Index(single_path, model=tiny_encoder)
    scored, given, memos = [], [], []
    real_rank, real_probed = search_module.rank_stored, search_module.Index.probed

    def spy_rank(q, s, corpus, *args, **kw):
        scored.append(sorted(corpus.ids))
        return real_rank(q, s, corpus, *args, **kw)

    def spy_probed(self, cs, nprobe, ncandidates, allowed=None, probes=None):
        given.append(cs)
        memos.append(probes)
        return real_probed(self, cs, nprobe, ncandidates, allowed, probes)

    monkeypatch.setattr(search_module, "rank_stored", spy_rank)
    monkeypatch.setattr(search_module.Index, "probed", spy_probed)
    checked = 0
    for granularity, k in (("passage", 3), ("sentence", 3)):
        for query in QUERIES:
            for n, nprobe in ((4, 1), (8, 2), (24, 4)):
                q, s = single.encode_query(query, granularity)
                want = single.search_vectors(q, s, granularity, k, ncandidates=n, nprobe=nprobe)
                alone = scored.pop()
                scored.clear()
                given.clear()
                memos.clear()
                hits = sharded.search_vectors(q, s, granularity, k, ncandidates=n, nprobe=nprobe)
                assert len(given) == 4 and all(g is given[0] for g in given)  # one centroid product
                assert all(m is memos[0] for m in memos) and len(memos[0]) == 1  # one top-nprobe
                assert scored == [alone]  # one exact stage, the single index's candidates
                assert [(h.passage_id, h.start, h.end) for h in hits] == [(h.passage_id, h.start, h.end)
                                                                          for h in want]
                assert np.allclose([h.score for h in hits], [h.score for h in want], atol=1e-5)
                assert [h.metadata for h in hits] == [h.metadata for h in want]
                assert all(h.metadata == {"n": int(h.passage_id[3:]), "even": int(h.passage_id[3:]) % 2 == 0}
                           for h in hits)
                scored.clear()
                checked += len(alone) < len(passages)
    assert checked, "no search pruned anything"


@pytest.mark.parametrize("pool_factor", [1, 2])
def test_shards_gather_into_one_corpus_as_their_corpora_join(tmp_path, tiny_encoder, pool_factor):
    """The sharded exact stage gathers its shards' passages into one corpus in one pass
    (``store.gather``): the same corpus, field by field, as each shard's own corpus joined
    (``EncodedCorpus.concat``), for every granularity's flags, pooled or not; a store of another
    codec is refused."""
    import torch

    from agrame.corpus import EncodedCorpus
    from agrame.index.codec import ResidualCodec
    from agrame.index.store import gather

    build_sharded(tiny_encoder, _many(), tmp_path / "sh", 3, progress=False, chunk_passages=4,
                  pool_factor=pool_factor)
    stores = [shard.store for shard in ShardedIndex(tmp_path / "sh", model=tiny_encoder).shards]
    rng = np.random.default_rng(pool_factor)
    parts = [(store, rng.permutation(len(store))[:max(1, len(store) - 2)]) for store in stores]
    parts.insert(1, (stores[2], np.array([0], dtype=np.int64)))  # one store twice: its rows keep their order
    for flags in ({}, {"with_offsets": False}, {"with_sentences": False}, {"lazy": True}):
        one = gather(parts, **flags)
        joined = EncodedCorpus.concat([store.corpus(pids, **flags) for store, pids in parts])
        vectors = [c.vectors.decompress() if hasattr(c.vectors, "decompress") else c.vectors for c in (one, joined)]
        assert torch.equal(*vectors), flags
        for name in ("offsets", "token_passage", "token_sentence", "sentences", "sentence_passage", "passage_starts"):
            assert torch.equal(getattr(one, name), getattr(joined, name)), (flags, name)
        assert list(one.ids) == list(joined.ids) and list(one.texts) == list(joined.texts), flags
        assert one.spans == joined.spans, flags
        assert one.pool_members.keys() == joined.pool_members.keys(), flags
        for k, (offsets, assignment) in one.pool_members.items():
            assert torch.equal(offsets, joined.pool_members[k][0]) and np.array_equal(assignment,
                                                                                        joined.pool_members[k][1])
    assert bool(one.pool_members) == (pool_factor > 1)
    # A lazy corpus reads a hit's record once, for its id and its text.
    read = []
    for store in stores:
        store.record = (lambda record: lambda p: read.append(p) or record(p))(store.record)
    lazy = gather(parts, with_offsets=False)
    assert read == [] and (lazy.ids[2], lazy.texts[2]) == (joined.ids[2], joined.texts[2]) and len(read) == 1
    codec = stores[0].codec
    other = ResidualCodec(codec.centroids, codec.cutoffs, codec.weights * 2, codec.nbits)
    stores[1].codec = other
    with pytest.raises(ValueError, match="different codecs"):
        gather(parts)
