"""Additive (residual-quantized) residuals, ``rqMxB`` (issue 64, item 2): the beam encoder and the codec against
naive loops, and an index built with it keeping every guarantee the other codecs' do (exact = brute force, the
compiled exact stage, lookup tables, add / upsert / compact, the manifest's checks, the command line, Ray)."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.corpus import Passage
from agrame.index import Index, IndexFolderError, IndexWriter, build_index
from agrame.index.codec import (AdditiveCodec, ProductCodec, beam_encode, codec_from_state, pack_codes,
                                parse_residuals, residuals_name)
from agrame.index.format import residuals_of, validate_manifest
from agrame.index.lut import residual_tables, table_scores

from test_index import TEXTS


def random_rq(rng: np.random.Generator, dim: int, k: int, m: int, nbits: int) -> AdditiveCodec:
    centroids = rng.standard_normal((k, dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    # each codebook smaller than the one before, as trained ones are
    books = (0.1 * rng.standard_normal((m, 1 << nbits, dim)) / np.arange(1, m + 1)[:, None, None]).astype(np.float32)
    return AdditiveCodec(centroids, books, nbits)


def naive_beam(residual: np.ndarray, books: np.ndarray, beam: int) -> list:
    """The beam search written out: every partial sum's extensions, the ``beam`` nearest kept, in float64."""
    partial = [(0.0, [], np.zeros_like(residual))]
    for book in books:
        extended = []
        for _, words, total in partial:
            for v, codeword in enumerate(book):
                nxt = total + codeword
                extended.append((float(((residual - nxt) ** 2).sum()), words + [v], nxt))
        partial = heapq.nsmallest(beam, extended, key=lambda e: e[0])
    return partial[0][1]


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 4), nbits=st.sampled_from([4, 6]), beam=st.integers(1, 6), n=st.integers(1, 8),
       seed=st.integers(0, 10_000))
def test_the_beam_encoder_equals_a_naive_beam_search(m, nbits, beam, n, seed):
    rng = np.random.default_rng(seed)
    books = rng.standard_normal((m, 1 << nbits, 6)) / np.arange(1, m + 1)[:, None, None]
    residuals = rng.standard_normal((n, 6))
    got = beam_encode(torch.from_numpy(residuals), torch.from_numpy(books), beam).numpy()
    assert got.shape == (n, m)
    for i in range(n):
        assert list(got[i]) == naive_beam(residuals[i], books, beam)


def test_a_wider_beam_codes_no_worse_on_average():
    rng = np.random.default_rng(0)
    codec = random_rq(rng, 16, 3, 4, 6)
    residuals = (0.1 * rng.standard_normal((2000, 16))).astype(np.float32)
    books = torch.from_numpy(codec.codebooks)

    def error(beam):
        codes = beam_encode(torch.from_numpy(residuals), books, beam).numpy()
        coded = sum(codec.codebooks[s, codes[:, s]] for s in range(codec.m))
        return float(((residuals - coded) ** 2).sum(axis=1).mean())

    assert error(5) < error(1)


@settings(max_examples=30, deadline=None)
@given(m=st.sampled_from([1, 2, 3, 4, 8]), nbits=st.sampled_from([4, 6, 7, 8]), n=st.integers(1, 40),
       length=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_decompress_tables_and_the_compiled_stage_equal_naive_sums(m, nbits, n, length, seed):
    from agrame import scoring

    m = {4: 2 * m, 6: 4 * m, 7: 8, 8: m}[nbits]  # (codes that fill whole bytes)
    rng = np.random.default_rng(seed)
    codec = random_rq(rng, 12, 5, m, nbits)
    codes = rng.integers(0, 1 << nbits, (n, m))
    packed = pack_codes(codes, nbits)
    ids = rng.integers(0, 5, n)
    got = codec.decompress(ids, packed, normalize=False).numpy()
    for i in range(n):
        want = codec.centroids32[ids[i]] + sum(codec.codebooks[s, codes[i, s]] for s in range(m))
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-5)
    unit = codec.decompress(ids, packed)
    np.testing.assert_allclose(unit.norm(dim=1).numpy(), 1.0, atol=1e-5)
    q = torch.from_numpy(rng.standard_normal((length, 12)).astype(np.float32))
    # lookup tables: a token's residual score is the sum of its m entries
    query_ids = rng.integers(0, length, n)
    tables = residual_tables(q, codec)
    assert tables.shape == (length, m, 1 << nbits)
    centroid_part = (q[torch.from_numpy(query_ids)] * torch.from_numpy(codec.centroids32[ids])).sum(dim=1).numpy()
    expected = (q[torch.from_numpy(query_ids)] * torch.from_numpy(got)).sum(dim=1).numpy()
    np.testing.assert_allclose(centroid_part + table_scores(tables, query_ids, codec.lookup_codes(packed)), expected,
                               rtol=1e-5, atol=1e-5)
    # the compiled exact stage (codewords added over every dimension) and its array form: the runs' maxima
    starts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, 3)]))
    for compiled in (True, False):
        runs = scoring.compressed_run_max(codec.table_queries(q), *codec.table_form(ids, packed), starts,
                                          compiled=compiled)
        for r in range(len(starts) - 1):
            want = (q @ unit[starts[r]:starts[r + 1]].T).amax(dim=1)
            np.testing.assert_allclose(runs[:, r].numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_trained_codec_codes_closer_than_a_product_code_of_the_same_bytes():
    rng = np.random.default_rng(0)
    # tokens near a few directions, with correlated dimensions (what a product code cannot model)
    mix = rng.standard_normal((32, 32)).astype(np.float32)
    x = rng.standard_normal((8000, 32)).astype(np.float32) @ mix
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rq = AdditiveCodec.train(x, 16, 8, 4, niter=4)
    pq = ProductCodec.train(x, 16, 8, 4, niter=4)
    assert np.array_equal(rq.centroids, pq.centroids)  # the same k-means
    fresh = x[-1000:]

    def error(codec):
        ids, packed = codec.compress(fresh)
        assert packed.shape == (1000, 4)
        return float(((codec.decompress(ids, packed, normalize=False).numpy() - fresh) ** 2).sum(axis=1).mean())

    centroid_only = float(((rq.centroids32[rq.assign(fresh)] - fresh) ** 2).sum(axis=1).mean())
    assert error(rq) < 0.9 * error(pq) < 0.9 * centroid_only


def test_names_and_states():
    assert parse_residuals("rq14x8") == ("rq", 8, 14) and residuals_name("RQ15x8") == "rq15x8"
    assert parse_residuals("rq4x6") == ("rq", 6, 4)
    for bad in ("rq14x5", "rqx8", "rq0x8", "rq3x6", "rq4x7"):
        with pytest.raises(ValueError, match="residual codec"):
            parse_residuals(bad)
    codec = random_rq(np.random.default_rng(0), 16, 3, 5, 8)
    again = codec_from_state(codec.state())
    assert isinstance(again, AdditiveCodec) and again.name == "rq5x8" and again.bytes_per_token == 5
    assert np.array_equal(again.codebooks, codec.codebooks) and np.array_equal(again.centroids, codec.centroids)
    with pytest.raises(ValueError, match="do not fit"):
        AdditiveCodec(codec.centroids, np.zeros((3, 256, 8), np.float32), 8)  # codewords not a token wide


def _passages():
    return [Passage(f"p{i}", t, metadata={"n": i}) for i, t in enumerate(TEXTS)]


def _brute_force(store, q):
    want = {}
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        vectors = store.codec.decompress(store.codes[rows], store.residuals[rows])
        want[store.record(p)["id"]] = float((q @ vectors.T).amax(dim=1).sum())
    return want


def test_an_index_with_additive_codes_is_exact_and_keeps_its_codec_through_changes(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    passages = _passages()
    build_index(tiny_encoder, passages[:4], path, nbits="rq3x8", progress=False)
    m = json.loads((path / "manifest.json").read_text())
    d = m["dim"]
    assert residuals_of(m) == "rq3x8" and m["rq_codebooks"] == 3 and m["nbits"] == 8 and "pq_subvectors" not in m
    assert m["files"]["rq.f32"]["size"] == 3 * 256 * d * 4 and m["files"]["residuals.bin"]["size"] == 3 * m["num_tokens"]
    books = np.fromfile(path / "rq.f32", dtype="<f4")
    with IndexWriter(path) as writer:
        writer.add(tiny_encoder, passages[4:], progress=False)
        writer.upsert(tiny_encoder, [Passage("p1", "Coral polyps build reefs in warm shallow seas.")], progress=False)
        writer.delete(["p2"])
        writer.compact()
    index = Index(path, model=tiny_encoder)
    store = index.store
    assert isinstance(store.codec, AdditiveCodec) and store.codec.name == "rq3x8"
    assert np.array_equal(store.codec.codebooks.ravel(), books)  # the codec is the index's, kept
    assert sorted(store.live_ids()) == sorted(p.id for p in passages if p.id != "p2")
    # the upserted passage's stored codes are what the codec gives its vectors now
    fresh = tiny_encoder.encode_passages(["Coral polyps build reefs in warm shallow seas."])[0].vectors.numpy()
    codes, packed = store.codec.compress(fresh)
    rows = store.token_rows(np.array([store.position_of(["p1"])["p1"]]))
    assert np.array_equal(np.asarray(store.codes[rows]), codes)
    assert np.array_equal(np.asarray(store.residuals[rows]), packed)
    q = tiny_encoder.encode_query("coral reef bleaching", "Q").vectors.float()
    want = _brute_force(store, q)
    for exact in (True, False):  # brute force (float64), and the staged search's compiled exact stage
        hits = index.search_vectors(q, q, "passage", top_k=None if exact else len(want), exact=exact)
        assert [h.passage_id for h in hits][:3] == sorted(want, key=lambda k: -want[k])[:3]
        for h in hits:
            assert h.score == pytest.approx(want[h.passage_id], abs=1e-4)
    # lookup-table candidates over every centroid rank by the unnormalised MaxSim
    got = index.warp_candidates(q, store.codec.num_centroids, len(store))
    raw = []
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        raw.append(float((q @ store.codec.decompress(store.codes[rows], store.residuals[rows], normalize=False).T)
                         .amax(dim=1).sum()))
    live = [p for p in range(len(store)) if store.record(p)["id"] in want]
    assert [p for p in got if p in live] == [p for p in np.argsort(-np.array(raw), kind="stable") if p in live]
    top = index.search("coral reef bleaching", "sentence", top_k=2)
    assert len(top) == 2  # (p1 was upserted without metadata)
    assert all(h.metadata == ({} if h.passage_id == "p1" else {"n": int(h.passage_id[1:])}) for h in top)


def test_the_manifest_checks_additive_code_fields(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, nbits="rq2x8", progress=False)
    good = json.loads((path / "manifest.json").read_text())
    for field, value, problem in (("rq_codebooks", 0, "rq_codebooks"), ("nbits", 2, "nbits"),
                                  ("rq_codebooks", 3, "rq.f32|residuals.bin"), ("pq_subvectors", 2, "rq_codebooks")):
        with pytest.raises(IndexFolderError, match=problem):
            validate_manifest(path, {**good, field: value})
    no_books = {**good, "files": {k: v for k, v in good["files"].items() if k != "rq.f32"}}
    with pytest.raises(IndexFolderError, match="lacks rq.f32"):
        validate_manifest(path, no_books)


def test_the_command_line_builds_additive_codes_and_refuses_a_bad_name(capsys, coral_file, tiny_model_dir, tmp_path):
    from test_cli import run

    idx = tmp_path / "idx"
    code, _, err = run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir, "--nbits", "rq3x8"], capsys)
    assert code == 0, err
    assert residuals_of(json.loads((idx / "manifest.json").read_text())) == "rq3x8"
    code, out, _ = run(["search", "-i", idx, "-f", "jsonl", "-k", "1", "coral bleaching"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as info:
        run(["index", "-p", coral_file, "-i", tmp_path / "b", "-m", tiny_model_dir, "--nbits", "rq3x6"], capsys)
    assert info.value.code == 2 and "rq3x6" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_a_sharded_index_and_a_ray_work_folder_keep_an_additive_codec(tmp_path, tiny_encoder):
    from agrame.index.distributed import WorkFolder
    from agrame.index.sharded import ShardedIndex, build_sharded

    codec = random_rq(np.random.default_rng(0), 16, 3, 4, 8)
    work = WorkFolder(tmp_path / "work")
    work.start({"fingerprint": "f", "num_blocks": 1}, codec, {})
    _, again = work.resume("f")  # (what a resumed build and every Ray actor rebuild from)
    assert isinstance(again, AdditiveCodec) and again.name == "rq4x8"
    assert np.array_equal(again.codebooks, codec.codebooks) and np.array_equal(again.centroids, codec.centroids)
    path = build_sharded(tiny_encoder, _passages(), tmp_path / "sh", 2, nbits="rq2x8", progress=False)
    sharded = ShardedIndex(path, model=tiny_encoder)
    assert sharded.manifest["rq_codebooks"] == 2 and sharded.manifest["nbits"] == 8
    assert len(sharded.search("coral reef bleaching", "passage", top_k=3)) == 3


@settings(max_examples=40, deadline=None)
@given(nbits=st.sampled_from([4, 6, 7, 8]), groups=st.integers(1, 3), n=st.integers(0, 9), seed=st.integers(0, 10_000))
def test_packed_rows_read_the_codes_as_unpack_does(nbits, groups, n, seed):
    from agrame import scoring
    from agrame.index.codec import codes_per_group, unpack_codes

    m = groups * codes_per_group(nbits)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << nbits, (n, m))
    packed = pack_codes(codes, nbits)
    want = unpack_codes(packed, nbits, m).astype(np.int64) + np.arange(m) * (1 << nbits)
    assert np.array_equal(scoring.PackedRows(packed, nbits, m, 1 << nbits).rows(), want)
    # the compiled loop reads the same rows where they lie: a one-hot table shows which row each group took
    table = np.zeros((m << nbits, 1), dtype=np.float32)
    table[:, 0] = np.arange(m << nbits, dtype=np.float32) + 1  # row r holds r + 1
    centroids = np.zeros((1, m), dtype=np.float32)
    if n:
        for t in range(n):  # one token a run, one query per group picking out that group's dimension
            got = scoring.compressed_run_max(torch.eye(m), centroids, np.zeros(1, np.int64),
                                             scoring.PackedRows(packed[t:t + 1], nbits, m, 1 << nbits), table,
                                             np.array([0, 1]), compiled=True)[:, 0].numpy()
            row_values = want[t] + 1.0
            np.testing.assert_allclose(got, row_values / np.linalg.norm(row_values), rtol=1e-6)
