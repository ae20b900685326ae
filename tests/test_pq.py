"""Product-quantized residuals (issue 64, item 2): the codec against naive loops, and an index built with it
keeping every guarantee the scalar codec's does (exact = brute force, lookup tables, add / upsert / compact,
the manifest's checks, the command line)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.corpus import Passage
from agrame.index import Index, IndexFolderError, IndexWriter, build_index
from agrame.index.codec import (ProductCodec, ResidualCodec, codec_from_state, pack_codes, parse_residuals,
                                residuals_name, unpack_codes)
from agrame.index.format import residuals_of, validate_manifest
from agrame.index.lut import residual_tables, table_scores

from test_index import TEXTS


def random_pq(rng: np.random.Generator, dim: int, k: int, m: int, nbits: int, rotate: bool = False) -> ProductCodec:
    centroids = rng.standard_normal((k, dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    books = (0.1 * rng.standard_normal((m, 1 << nbits, dim // m))).astype(np.float32)
    rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0].astype(np.float32) if rotate else None
    return ProductCodec(centroids, books, nbits, rotation)


@settings(max_examples=40, deadline=None)
@given(nbits=st.sampled_from([4, 6, 7, 8]), quads=st.integers(1, 5), rows=st.integers(0, 6), seed=st.integers(0, 10_000))
def test_pack_unpack_codes_round_trip(nbits, quads, rows, seed):
    m = (8 if nbits == 7 else 4) * quads
    codes = np.random.default_rng(seed).integers(0, 1 << nbits, size=(rows, m))
    packed = pack_codes(codes, nbits)
    assert packed.shape == (rows, m * nbits // 8) and packed.dtype == np.uint8
    assert (unpack_codes(packed, nbits, m) == codes).all()


def test_six_bit_codes_are_packed_big_endian_four_in_three_bytes():
    # 1, 2, 3, 4 as 6-bit fields: 000001 000010 000011 000100
    assert pack_codes(np.array([[1, 2, 3, 4]]), 6).tolist() == [[0b00000100, 0b00100000, 0b11000100]]


def test_seven_bit_codes_are_packed_big_endian_eight_in_seven_bytes():
    codes = np.array([[1, 2, 3, 4, 5, 6, 7, 127]])
    bits = "".join(format(c, "07b") for c in codes[0])
    assert pack_codes(codes, 7).tolist() == [[int(bits[i:i + 8], 2) for i in range(0, 56, 8)]]
    with pytest.raises(ValueError, match="whole number of bytes"):
        pack_codes(np.zeros((1, 4), dtype=np.uint8), 7)


@settings(max_examples=30, deadline=None)
@given(m=st.sampled_from([2, 4, 8]), nbits=st.sampled_from([4, 6, 7, 8]), n=st.integers(1, 30),
       seed=st.integers(0, 10_000), rotate=st.booleans())
def test_quantize_and_decompress_equal_naive_loops(m, nbits, n, seed, rotate):
    if nbits == 6 and m % 4:
        m = 4  # (6-bit codes come four to three bytes)
    if nbits == 7:
        m = 8  # (7-bit codes come eight to seven bytes)
    rng = np.random.default_rng(seed)
    dim = 8 * m if m < 8 else 16
    codec = random_pq(rng, dim, 5, m, nbits, rotate)
    residuals = (0.1 * rng.standard_normal((n, dim))).astype(np.float32)
    codes = codec.quantize(residuals)
    sub = dim // m
    for i in range(n):
        for s in range(m):
            distances = [float(((residuals[i, s * sub:(s + 1) * sub] - codec.codebooks[s, v]) ** 2).sum())
                         for v in range(1 << nbits)]
            assert distances[codes[i, s]] == pytest.approx(min(distances), abs=1e-6)
    ids = rng.integers(0, 5, n)
    got = codec.decompress(ids, pack_codes(codes, nbits), normalize=False).numpy()
    for i in range(n):
        coded = np.concatenate([codec.codebooks[s, codes[i, s]] for s in range(m)])
        if rotate:  # the codewords code the rotated residual: rotated back
            coded = codec.rotation @ coded
        want = codec.centroids32[ids[i]] + coded
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-5)
    unit = codec.decompress(ids, pack_codes(codes, nbits)).numpy()
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(nbits=st.sampled_from([4, 6, 7, 8]), n=st.integers(1, 40), length=st.integers(1, 5), seed=st.integers(0, 10_000),
       rotate=st.booleans())
def test_table_scores_of_product_codes_equal_decompress_then_dot(nbits, n, length, seed, rotate):
    from agrame import scoring

    rng = np.random.default_rng(seed)
    codec = random_pq(rng, 32, 7, 8, nbits, rotate)
    ids = rng.integers(0, 7, n)
    packed = pack_codes(rng.integers(0, 1 << nbits, (n, 8)), nbits)
    q = torch.from_numpy(rng.standard_normal((length, 32)).astype(np.float32))
    query_ids = rng.integers(0, length, n)
    vectors = codec.decompress(ids, packed, normalize=False)
    expected = (q[torch.from_numpy(query_ids)] * vectors).sum(dim=1).numpy()
    centroid_part = (q[torch.from_numpy(query_ids)] * torch.from_numpy(codec.centroids32[ids])).sum(dim=1).numpy()
    tables = residual_tables(q, codec)
    assert tables.shape == (length, 8, 1 << nbits)
    got = centroid_part + table_scores(tables, query_ids, codec.lookup_codes(packed))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # the compiled exact stage's form (rotated queries against rotated tokens): decompress-then-dot's maxima
    starts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, 3)]))
    for compiled in (True, False):
        runs = scoring.compressed_run_max(codec.table_queries(q), *codec.table_form(ids, packed), starts,
                                          compiled=compiled)
        unit = codec.decompress(ids, packed)
        for r in range(len(starts) - 1):
            want = (q @ unit[starts[r]:starts[r + 1]].T).amax(dim=1)
            np.testing.assert_allclose(runs[:, r].numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_trained_codec_beats_the_centroid_alone_and_matches_faiss_reconstruction():
    import faiss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    codec = ProductCodec.train(x, 16, 6, 8, niter=4)
    ids, packed = codec.compress(x[:500])
    coded = codec.decompress(ids, packed, normalize=False).numpy()
    centroid_only = codec.centroids32[ids]
    assert np.abs(coded - x[:500]).mean() < 0.8 * np.abs(centroid_only - x[:500]).mean()
    # faiss's own encoder and decoder with these codebooks give the same reconstructions
    pq = faiss.ProductQuantizer(32, 8, 6)
    faiss.copy_array_to_vector(codec.codebooks.ravel(), pq.centroids)
    residual = np.ascontiguousarray(x[:500] - centroid_only)
    np.testing.assert_allclose(pq.decode(pq.compute_codes(residual)), coded - centroid_only, atol=1e-6)


def test_names_and_states():
    assert parse_residuals("pq16x6") == ("pq", 6, 16) and parse_residuals(2) == ("scalar", 2, 0)
    assert parse_residuals("opq16x7") == ("opq", 7, 16) and residuals_name("OPQ16x7") == "opq16x7"
    assert residuals_name("4bit") == "4bit" and residuals_name("PQ8x8") == "pq8x8"
    for bad in ("pq16x5", "pqx6", "3", "pq0x6", "opq4x7", "pq2x6"):
        with pytest.raises(ValueError, match="residual codec"):
            parse_residuals(bad)
    rng = np.random.default_rng(0)
    codec = random_pq(rng, 16, 3, 4, 6)
    again = codec_from_state(codec.state())
    assert isinstance(again, ProductCodec) and np.array_equal(again.codebooks, codec.codebooks)
    assert again.rotation is None and again.name == "pq4x6"
    rotated = random_pq(rng, 16, 3, 8, 7, rotate=True)
    again = codec_from_state(rotated.state())
    assert again.name == "opq8x7" and np.array_equal(again.rotation, rotated.rotation)
    with pytest.raises(ValueError, match="orthonormal"):
        ProductCodec(rotated.centroids, rotated.codebooks, 7, 2 * rotated.rotation)
    scalar = ResidualCodec(codec.centroids, np.zeros(3), np.arange(4), 2)
    assert isinstance(codec_from_state(scalar.state()), ResidualCodec)
    with pytest.raises(ValueError, match="do not fit"):
        ProductCodec(codec.centroids, np.zeros((3, 64, 5), np.float32), 6)


def _passages():
    return [Passage(f"p{i}", t, metadata={"n": i}) for i, t in enumerate(TEXTS)]


def test_an_index_with_product_codes_is_exact_where_asked_and_keeps_its_format(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, nbits="pq4x6", progress=False)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["nbits"] == 6 and manifest["pq_subvectors"] == 4 and residuals_of(manifest) == "pq4x6"
    assert "buckets.f32" not in manifest["files"] and manifest["files"]["pq.f32"]["size"] == 64 * 16 * 4
    assert manifest["files"]["residuals.bin"]["size"] == 3 * manifest["num_tokens"]
    index = Index(path, model=tiny_encoder)
    store = index.store
    assert isinstance(store.codec, ProductCodec)
    # exact search equals brute force over the decompressed vectors
    q = tiny_encoder.encode_query("coral reef bleaching", "Q").vectors.float()
    hits = index.search_vectors(q, q, "passage", top_k=None, exact=True)
    want = {}
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        vectors = store.codec.decompress(store.codes[rows], store.residuals[rows])
        want[store.record(p)["id"]] = float((q @ vectors.T).amax(dim=1).sum())
    assert [h.passage_id for h in hits] == sorted(want, key=lambda k: -want[k])
    for h in hits:
        assert h.score == pytest.approx(want[h.passage_id], abs=1e-4)
    # lookup-table candidates over every centroid rank by the unnormalised MaxSim
    got = index.warp_candidates(q, store.codec.num_centroids, len(store))
    raw = []
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        raw.append(float((q @ store.codec.decompress(store.codes[rows], store.residuals[rows], normalize=False).T)
                         .amax(dim=1).sum()))
    assert list(got) == list(np.argsort(-np.array(raw), kind="stable"))
    # a staged search answers, with metadata
    top = index.search("coral reef bleaching", "sentence", top_k=2)
    assert len(top) == 2 and top[0].metadata


def test_add_upsert_and_compact_keep_product_codes(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    passages = _passages()
    build_index(tiny_encoder, passages[:4], path, nbits="pq4x6", progress=False)
    books = np.fromfile(path / "pq.f32", dtype="<f4")
    with IndexWriter(path) as writer:
        writer.add(tiny_encoder, passages[4:], progress=False)
        writer.upsert(tiny_encoder, [Passage("p1", "Coral polyps build reefs in warm shallow seas.")], progress=False)
        writer.delete(["p2"])
        writer.compact()
    index = Index(path, model=tiny_encoder)
    m = index.store.manifest
    assert residuals_of(m) == "pq4x6" and isinstance(index.store.codec, ProductCodec)
    assert np.array_equal(index.store.codec.codebooks.ravel(), books)  # the codec is the index's, kept
    assert m["files"]["residuals.bin"]["size"] == 3 * m["num_tokens"]
    assert sorted(index.store.live_ids()) == sorted(p.id for p in passages if p.id != "p2")
    # the upserted passage's stored codes are what the codec gives its vectors now
    fresh = tiny_encoder.encode_passages(["Coral polyps build reefs in warm shallow seas."])[0].vectors.numpy()
    codes, packed = index.store.codec.compress(fresh)
    p = index.store.position_of(["p1"])["p1"]
    rows = index.store.token_rows(np.array([p]))
    assert np.array_equal(np.asarray(index.store.codes[rows]), codes)
    assert np.array_equal(np.asarray(index.store.residuals[rows]), packed)


def test_the_manifest_checks_product_code_fields(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, _passages(), path, nbits="pq4x6", progress=False)
    good = json.loads((path / "manifest.json").read_text())
    for field, value, problem in (("pq_subvectors", 3, "pq_subvectors"), ("nbits", 2, "nbits"),
                                  ("pq_subvectors", 8, "residuals.bin")):
        bad = {**good, field: value}
        with pytest.raises(IndexFolderError, match=problem):
            validate_manifest(path, bad)
    no_books = {**good, "files": {k: v for k, v in good["files"].items() if k != "pq.f32"}}
    with pytest.raises(IndexFolderError, match="lacks pq.f32"):
        validate_manifest(path, no_books)


def test_the_command_line_builds_product_codes_and_refuses_a_bad_name(capsys, coral_file, tiny_model_dir, tmp_path):
    from test_cli import run

    idx = tmp_path / "idx"
    code, _, err = run(["index", "-p", coral_file, "-i", idx, "-m", tiny_model_dir, "--nbits", "pq4x6"], capsys)
    assert code == 0, err
    assert residuals_of(json.loads((idx / "manifest.json").read_text())) == "pq4x6"
    code, out, _ = run(["search", "-i", idx, "-f", "jsonl", "-k", "1", "coral bleaching"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as info:
        run(["index", "-p", coral_file, "-i", tmp_path / "b", "-m", tiny_model_dir, "--nbits", "pq5x6"], capsys)
    assert info.value.code == 2 and "pq5x6" in capsys.readouterr().err and not (tmp_path / "b").exists()
    code, _, err = run(["index", "--add", "-p", coral_file, "-i", idx, "--nbits", "2"], capsys)
    assert code == 2 and "keep the index's own residual codec" in err


def test_a_model_names_its_residual_codec(tiny_encoder, tmp_path):
    import copy

    from agrame.encoder import EncoderSettings, ModelError

    assert "residuals" not in EncoderSettings().to_json()  # a model from before it reads the same
    assert EncoderSettings.from_json({"residuals": "PQ4x6"}).residuals == "pq4x6"
    with pytest.raises(ModelError, match="residuals"):
        EncoderSettings.from_json({"residuals": "pq3x6"})
    encoder = copy.deepcopy(tiny_encoder)
    encoder.settings.residuals = "pq4x6"
    build_index(encoder, _passages(), tmp_path / "ix", progress=False)
    assert residuals_of(json.loads((tmp_path / "ix" / "manifest.json").read_text())) == "pq4x6"
    build_index(encoder, _passages(), tmp_path / "two", nbits=2, progress=False)
    assert residuals_of(json.loads((tmp_path / "two" / "manifest.json").read_text())) == "2bit"


def test_the_quantizer_learns_from_the_vectors_k_means_did_not_take():
    rng = np.random.default_rng(3)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    sample = unit(rng.standard_normal((400, 32)))
    extra = unit(rng.standard_normal((20_000, 32)))
    small = ProductCodec.train(sample, 8, 6, 8, niter=4)  # 20 held-out residuals: trained on all 400
    large = ProductCodec.train(sample, 8, 6, 8, niter=4, extra=extra)
    assert np.array_equal(small.centroids, large.centroids)  # k-means sees the same sample either way
    fresh = unit(rng.standard_normal((2_000, 32)))

    def error(codec):
        ids, packed = codec.compress(fresh)
        return float(((codec.decompress(ids, packed, normalize=False).numpy() - fresh) ** 2).sum(axis=1).mean())

    assert error(large) < 0.95 * error(small)


def test_a_ray_builds_work_folder_keeps_a_product_codec(tmp_path):
    from agrame.index.distributed import WorkFolder

    codec = random_pq(np.random.default_rng(0), 16, 3, 4, 6)
    work = WorkFolder(tmp_path / "ix")
    work.start({"fingerprint": "f", "num_blocks": 1}, codec, {})
    _, again = work.resume("f")  # (what a resumed build and every Ray actor rebuild from)
    assert isinstance(again, ProductCodec) and again.nbits == 6
    assert np.array_equal(again.codebooks, codec.codebooks) and np.array_equal(again.centroids, codec.centroids)


def test_an_index_with_rotated_seven_bit_codes_is_exact_and_keeps_its_rotation(tmp_path, tiny_encoder):
    # opq8x7 at d = 16: 7 bytes a token, residuals rotated before they are quantized (issue 64's ≤ 20 B rows)
    path = tmp_path / "ix"
    passages = _passages()
    build_index(tiny_encoder, passages[:4], path, nbits="opq8x7", progress=False)
    m = json.loads((path / "manifest.json").read_text())
    assert residuals_of(m) == "opq8x7" and m["pq_rotation"] is True and m["nbits"] == 7
    assert m["files"]["opq.f32"]["size"] == 16 * 16 * 4 and m["files"]["residuals.bin"]["size"] == 7 * m["num_tokens"]
    rotation = np.fromfile(path / "opq.f32", dtype="<f4").reshape(16, 16)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(16), atol=1e-5)
    assert not np.allclose(rotation, np.eye(16))  # (a learned rotation, not the identity)
    with IndexWriter(path) as writer:
        writer.add(tiny_encoder, passages[4:], progress=False)
        writer.delete(["p2"])
        writer.compact()
    index = Index(path, model=tiny_encoder)
    store = index.store
    assert store.codec.name == "opq8x7" and np.array_equal(store.codec.rotation, rotation)
    q = tiny_encoder.encode_query("coral reef bleaching", "Q").vectors.float()
    want = {}
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        vectors = store.codec.decompress(store.codes[rows], store.residuals[rows])
        want[store.record(p)["id"]] = float((q @ vectors.T).amax(dim=1).sum())
    for exact in (True, False):  # brute force (float64), and the staged search's compiled exact stage
        hits = index.search_vectors(q, q, "passage", top_k=None if exact else len(store), exact=exact)
        assert [h.passage_id for h in hits][:3] == sorted(want, key=lambda k: -want[k])[:3]
        for h in hits:
            assert h.score == pytest.approx(want[h.passage_id], abs=1e-4)
    bad = {**m, "pq_rotation": False}
    with pytest.raises(IndexFolderError, match="pq_rotation"):
        validate_manifest(path, bad)
    no_rotation = {**m, "files": {k: v for k, v in m["files"].items() if k != "opq.f32"}}
    with pytest.raises(IndexFolderError, match="lacks opq.f32"):
        validate_manifest(path, no_rotation)
