"""Compressed index (agrame-index/2): codec, inverted file, staged search, integrity, --add."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.corpus import EncodedCorpus, Passage
from agrame.encoder import EncodedPassage
from agrame.index import Index, IndexFolderError, ResidualCodec, add_passages, build_index, num_centroids
from agrame.index.codec import pack_bits, unpack_bits
from agrame.index.format import check_model, index_model_name
from agrame.index.ivf import build_ivf, decode_varint, derive_ivf, encode_varint, merge_ivf, unique_pairs
from agrame.index.writer import build_compressed
from agrame.ranker import Ranker, rank_corpus

TEXTS = [
    "Coral reefs are built by polyps. Warm water causes coral bleaching. Reefs protect coasts.",
    "The Great Barrier Reef lies off Queensland. It is visible from space.",
    "Bleaching happens when corals expel their algae. Recovery can take years.",
    "Tourism brings money to reef towns. Boats can damage coral.",
    "Marie Curie was born in Warsaw. She won two Nobel prizes.",
    "The Eiffel Tower is in Paris. It was built for the 1889 World's Fair.",
]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# -- codec ---------------------------------------------------------------------------------

@given(nbits=st.sampled_from([1, 2, 4, 8]), rows=st.integers(0, 5), seed=st.integers(0, 10_000))
def test_pack_unpack_round_trip(nbits, rows, seed):
    buckets = np.random.default_rng(seed).integers(0, 1 << nbits, size=(rows, 16))
    packed = pack_bits(buckets, nbits)
    assert packed.shape == (rows, 16 * nbits // 8) and packed.dtype == np.uint8
    assert (unpack_bits(packed, nbits, 16) == buckets).all()


def test_num_centroids_follows_colbertv2():
    assert num_centroids(4_400_000) == 32768  # 16·√T = 33,560 → 2^15
    assert num_centroids(100_000_000) == 131072
    assert num_centroids(1) == 16


@settings(max_examples=20, deadline=None)
@given(nbits=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 1000))
def test_codec_round_trip_within_bucket_bound(nbits, seed):
    rng = np.random.default_rng(seed)
    centers = _unit(rng.normal(size=(8, 16)))
    x = _unit(centers[rng.integers(0, 8, 600)] + 0.3 * rng.normal(size=(600, 16))).astype(np.float32)
    codec = ResidualCodec.train(x, 8, nbits, niter=4, seed=seed)
    codes, packed = codec.compress(x)
    raw = codec.decompress(codes, packed, normalize=False).numpy()
    residual = x - codec.centroids.astype(np.float32)[codes.astype(np.int64)]
    error = np.abs(raw - codec.centroids.astype(np.float32)[codes.astype(np.int64)] - residual)
    bucket = np.searchsorted(codec.cutoffs, residual, side="right")
    # Reconstruction values lie inside their buckets, so an interior value is off by at most
    # its bucket's width, an outer one by its distance to the nearest cut-off plus that width.
    edges = np.concatenate([[-np.inf], codec.cutoffs, [np.inf]])
    assert (codec.weights >= edges[:-1] - 1e-6).all() and (codec.weights <= edges[1:] + 1e-6).all()
    lo = np.where(np.isfinite(edges[bucket]), edges[bucket], codec.weights[bucket])
    hi = np.where(np.isfinite(edges[bucket + 1]), edges[bucket + 1], codec.weights[bucket])
    bound = np.maximum(hi, residual) - np.minimum(lo, residual)
    assert (error <= bound + 1e-5).all()
    unit = codec.decompress(codes, packed).numpy()
    assert np.allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5)


def test_more_bits_reconstruct_better():
    rng = np.random.default_rng(0)
    x = _unit(rng.normal(size=(2000, 32))).astype(np.float32)
    cos = []
    for nbits in (1, 2, 4, 8):
        codec = ResidualCodec.train(x, 64, nbits, niter=4)
        cos.append(float((codec.decompress(*codec.compress(x)).numpy() * x).sum(1).mean()))
    assert cos == sorted(cos) and cos[-1] > 0.999 and cos[1] > 0.85


def test_codec_rejects_bad_input():
    codec = ResidualCodec(np.eye(4, dtype=np.float16), [0.0], [-0.1, 0.1], 1)
    with pytest.raises(ValueError, match="expected"):
        codec.compress(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="nbits"):
        ResidualCodec(np.eye(4), [0.0], [-0.1, 0.1], 3)


# -- inverted file -------------------------------------------------------------------------

@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 30)), max_size=60), st.integers(0, 30))
def test_ivf_matches_naive_lists_and_merge(pairs, split):
    codes = np.array([c for c, _ in pairs], dtype=np.int64)
    pids = np.array([p for _, p in pairs], dtype=np.int64)
    ivf = build_ivf(unique_pairs(codes, pids), 8)
    for c in range(8):
        assert ivf.pids[ivf.offsets[c]:ivf.offsets[c + 1]].tolist() == sorted({p for cc, p in pairs if cc == c})
    first = pids < split
    merged = merge_ivf(build_ivf(unique_pairs(codes[first], pids[first]), 8),
                       unique_pairs(codes[~first], pids[~first]), 8)
    assert merged.offsets.tolist() == ivf.offsets.tolist() and merged.pids.tolist() == ivf.pids.tolist()


@settings(deadline=None)  # (the first example compiles the kernels)
@given(st.lists(st.lists(st.integers(0, 7), max_size=12), max_size=20), st.sampled_from(["<u2", "<i4"]))
def test_lists_derived_from_the_codes_equal_the_naive_ones(passages, dtype):
    codes = np.array([c for tokens in passages for c in tokens], dtype=dtype)
    doclens = np.array([len(tokens) for tokens in passages], dtype=np.int64)
    derived = derive_ivf(codes, doclens, 8)
    for c in range(8):  # each passage holding a token of c, once, in order
        assert derived.pids[derived.offsets[c]:derived.offsets[c + 1]].tolist() == \
            [p for p, tokens in enumerate(passages) if c in tokens]
    owners = np.repeat(np.arange(len(passages)), doclens)
    built = build_ivf(unique_pairs(codes, owners), 8)
    assert derived.offsets.tolist() == built.offsets.tolist() and derived.pids.dtype == np.int32
    assert derived.pids.tolist() == built.pids.tolist()
    if len(codes):
        with pytest.raises(ValueError, match="centroid"):
            derive_ivf(codes, doclens, int(codes.max()))
    if len(passages):
        with pytest.raises(ValueError, match="tokens"):
            derive_ivf(codes, doclens + 1, 8)


def _naive_varint(ivf) -> bytes:
    out = bytearray()
    for c in range(len(ivf.offsets) - 1):
        previous = 0
        for pid in ivf.pids[ivf.offsets[c]:ivf.offsets[c + 1]].tolist():
            gap, previous = pid - previous, pid
            while gap >= 0x80:
                out.append(gap & 0x7F | 0x80)
                gap >>= 7
            out.append(gap)
    return bytes(out)


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0, 1, 127, 128, 16383, 16384, 2 ** 21, 2 ** 31 - 1])
                          | st.integers(0, 300)), max_size=60))
def test_varint_lists_match_a_naive_loop_and_read_back(pairs):
    codes = np.array([c for c, _ in pairs], dtype=np.int64)
    pids = np.array([p for _, p in pairs], dtype=np.int64)
    ivf = build_ivf(unique_pairs(codes, pids), 6)
    data = encode_varint(ivf)
    assert data == _naive_varint(ivf)
    back = decode_varint(np.frombuffer(data, np.uint8), ivf.offsets, 2 ** 31)
    assert back.dtype == np.int32 and back.tolist() == ivf.pids.tolist()


def test_a_damaged_varint_stream_is_refused():
    ivf = build_ivf(unique_pairs(np.array([0, 0, 1, 2]), np.array([3, 900, 5, 7])), 3)
    data = np.frombuffer(encode_varint(ivf), np.uint8)
    assert decode_varint(data, ivf.offsets, 901).tolist() == [3, 900, 5, 7]
    with pytest.raises(ValueError, match="whole values"):
        decode_varint(data[:-1], ivf.offsets, 901)  # a value cut short
    with pytest.raises(ValueError, match="whole values"):
        decode_varint(np.append(data, 1).astype(np.uint8), ivf.offsets, 901)  # one value too many
    with pytest.raises(ValueError, match="passage 900 of 900"):
        decode_varint(data, ivf.offsets, 900)
    flat = data.copy()
    flat[1:3] = [0x80, 0]  # 900's gap after 3 (897: two bytes) becomes 0: not ascending
    with pytest.raises(ValueError, match="not ascending"):
        decode_varint(flat, ivf.offsets, 901)
    with pytest.raises(ValueError, match="over 5 bytes"):
        decode_varint(np.array([0x80] * 5 + [1, 1, 1, 1], np.uint8), np.array([0, 2, 3, 4]), 901)


# -- search ----------------------------------------------------------------------------------

def _synthetic(seed: int, passages: int = 120, dim: int = 16, clusters: int = 24):
    """Passages of clustered unit token vectors, without a model."""
    rng = np.random.default_rng(seed)
    centers = _unit(rng.normal(size=(clusters, dim)))
    items, encoded = [], []
    for p in range(passages):
        n = int(rng.integers(4, 12))
        topic = rng.integers(0, clusters, 3)
        vecs = _unit(centers[rng.choice(topic, n)] + 0.25 * rng.normal(size=(n, dim))).astype(np.float32)
        words = [f"w{p}x{i}" for i in range(n)]
        text = " ".join(words)
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        offsets = np.stack([starts, starts + [len(w) for w in words]], axis=1)
        items.append(Passage(f"p{p}", text))
        encoded.append(EncodedPassage(torch.from_numpy(vecs), torch.from_numpy(offsets.astype(np.int64))))
    return items, EncodedCorpus.build(items, encoded), rng


def test_full_probe_equals_exhaustive_scan(tmp_path, tiny_encoder):
    items, corpus, rng = _synthetic(0)
    build_compressed(tiny_encoder, items, tmp_path / "ix", encoded=corpus, progress=False, store_offsets=True)
    index = Index(tmp_path / "ix", model=tiny_encoder)
    q = torch.from_numpy(_unit(rng.normal(size=(5, 16))).astype(np.float32))
    for granularity in ("passage", "sentence"):
        exact = index.search_vectors(q, q, granularity, top_k=20, exact=True)
        staged = index.search_vectors(q, q, granularity, top_k=20, nprobe=10_000, ncandidates=10_000)
        # (exact mode scores in float64, rounded: the same hits, scores equal to float32 rounding)
        assert [(h.passage_id, h.start) for h in staged] == [(h.passage_id, h.start) for h in exact]
        assert [h.score for h in staged] == pytest.approx([h.score for h in exact], abs=1e-5)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_candidates_recover_exact_top1(tmp_path_factory, tiny_encoder, seed):
    items, corpus, rng = _synthetic(seed)
    path = tmp_path_factory.mktemp("ix") / "ix"
    build_compressed(tiny_encoder, items, path, encoded=corpus, progress=False, store_offsets=True)
    index = Index(path, model=tiny_encoder)
    # A query made of noisy copies of one passage's tokens has a clear best passage.
    target = int(rng.integers(0, len(items)))
    tokens = corpus.vectors[corpus.passage_tokens(target)].numpy()
    q = torch.from_numpy(_unit(tokens[:4] + 0.1 * rng.normal(size=tokens[:4].shape)).astype(np.float32))
    exact = index.search_vectors(q, q, "passage", top_k=1, exact=True)
    staged = index.search_vectors(q, q, "passage", top_k=1, nprobe=2, ncandidates=8)
    assert staged[0].passage_id == exact[0].passage_id
    assert len(index.candidates(q, 2, 8)) <= 8


def test_sentence_search_matches_in_memory_ranker_on_decompressed(tmp_path, tiny_encoder):
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", nbits=8, progress=False)
    index = Index(tmp_path / "ix", model=tiny_encoder)
    hits = index.search("coral bleaching", "sentence", top_k=None, nprobe=10_000, ncandidates=100)
    memory = Ranker(tiny_encoder).rank("coral bleaching", passages, "sentence", top_k=None)
    assert {(h.passage_id, h.start, h.end) for h in hits} == {(h.passage_id, h.start, h.end) for h in memory}
    # 8-bit residuals: scores within a small quantisation error of float32.
    by_key = {(h.passage_id, h.start): h.score for h in memory}
    assert max(abs(h.score - by_key[(h.passage_id, h.start)]) for h in hits) < 0.05
    for h in hits:
        assert TEXTS[int(h.passage_id)][h.start:h.end] == h.text


def test_passage_corpus_without_sentences_reads_records_lazily(tmp_path, tiny_encoder):
    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    store = Index(tmp_path / "ix", model=tiny_encoder).store
    pids = np.array([2, 0, 1])
    full, lean = store.corpus(pids), store.corpus(pids, with_sentences=False)
    assert torch.equal(full.vectors, lean.vectors) and torch.equal(full.passage_starts, lean.passage_starts)
    assert list(lean.ids) == full.ids and lean.texts[-1] == full.texts[-1] and len(lean) == 3
    q = tiny_encoder.encode_query("coral reef", "Q").vectors
    a = rank_corpus(q, None, full, "passage", alpha=0.5, top_k=2)
    b = rank_corpus(q, None, lean, "passage", alpha=0.5, top_k=2)
    assert a == b
    records = lean.ids._records
    assert len(records._cache) == 3  # ids were listed above; a fresh corpus reads only its hits
    fresh = store.corpus(pids, with_sentences=False)
    rank_corpus(q, None, fresh, "passage", alpha=0.5, top_k=1)
    assert len(fresh.ids._records._cache) == 1


def test_span_search_uses_stored_spans(tmp_path, tiny_encoder):
    passages = [Passage("a", TEXTS[0], ((0, 11), ((12, 19), (33, 43)))), Passage("b", TEXTS[1])]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    hits = Index(tmp_path / "ix", model=tiny_encoder).search("reef", "span", top_k=None)
    assert sorted(h.pieces for h in hits) == [((0, 11),), ((12, 19), (33, 43))]
    build_index(tiny_encoder, passages[1:], tmp_path / "none", progress=False)
    with pytest.raises(ValueError, match="holds no spans"):
        Index(tmp_path / "none", model=tiny_encoder).search("reef", "span")


def test_version1_folder_still_opens_and_searches(tmp_path, tiny_encoder):
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "v1", format=1, progress=False)
    index = Index(tmp_path / "v1", model=tiny_encoder)
    assert not index.compressed
    hits = index.search("coral bleaching", "sentence", top_k=3)
    memory = Ranker(tiny_encoder).rank("coral bleaching", passages, "sentence", top_k=3)
    assert [(h.passage_id, h.start) for h in hits] == [(h.passage_id, h.start) for h in memory]


# -- integrity ---------------------------------------------------------------------------------

@pytest.fixture
def small_index(tmp_path, tiny_encoder):
    path = tmp_path / "ix"
    build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS)], path, progress=False)
    return path


def test_truncated_damaged_and_missing_files_are_refused(small_index, tiny_encoder):
    Index(small_index, model=tiny_encoder)
    codes = small_index / "codes.bin"
    data = codes.read_bytes()
    codes.write_bytes(data[:-2])
    with pytest.raises(IndexFolderError, match="codes.bin is truncated"):
        Index(small_index)
    codes.write_bytes(data)
    residuals = small_index / "residuals.bin"
    damaged = bytearray(residuals.read_bytes())
    damaged[3] ^= 0xFF
    residuals.write_bytes(bytes(damaged))
    with pytest.raises(IndexFolderError, match="residuals.bin does not match its checksum"):
        Index(small_index)
    residuals.unlink()
    with pytest.raises(IndexFolderError, match="residuals.bin is missing"):
        Index(small_index)


def test_bytes_past_the_committed_size_are_an_interrupted_append(small_index, tiny_encoder):
    with open(small_index / "codes.bin", "ab") as f:
        f.write(b"\x01\x02")
    assert len(Index(small_index, model=tiny_encoder)) == len(TEXTS)


# -- add ---------------------------------------------------------------------------------------

def test_add_equals_building_all_at_once_with_the_same_centroids(tmp_path, tiny_encoder):
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages[:3], tmp_path / "grown", progress=False)
    before = Index(tmp_path / "grown", model=tiny_encoder)
    old_hits = before.search("reef", "passage", top_k=None, nprobe=2, ncandidates=4)
    manifest = add_passages(tmp_path / "grown", tiny_encoder, passages[3:], progress=False)
    assert manifest["generation"] == 2 and manifest["num_passages"] == len(TEXTS)
    build_index(tiny_encoder, passages, tmp_path / "whole", codec=before.store.codec, progress=False)
    grown, whole = Index(tmp_path / "grown", model=tiny_encoder), Index(tmp_path / "whole", model=tiny_encoder)
    for granularity in ("passage", "sentence"):
        for settings_ in ({}, {"nprobe": 1, "ncandidates": 2}, {"exact": True}):
            a = grown.search("coral reef bleaching", granularity, top_k=None, **settings_)
            b = whole.search("coral reef bleaching", granularity, top_k=None, **settings_)
            assert [(h.passage_id, h.start, h.score) for h in a] == [(h.passage_id, h.start, h.score) for h in b]
    # A reader of the old generation keeps it until it reloads.
    assert before.search("reef", "passage", top_k=None, nprobe=2, ncandidates=4) == old_hits
    assert before.reload() and len(before) == len(TEXTS)
    with pytest.raises(IndexFolderError, match="already in"):
        add_passages(tmp_path / "grown", tiny_encoder, passages[:1], progress=False)


def test_interrupted_add_leaves_the_last_generation(tmp_path, tiny_encoder, monkeypatch):
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS)]
    path = tmp_path / "ix"
    build_index(tiny_encoder, passages[:3], path, progress=False)
    import agrame.index.store as store

    calls = {"n": 0}
    real = store._ChunkWriter.write

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(store._ChunkWriter, "write", failing)
    with pytest.raises(KeyboardInterrupt):
        add_passages(path, tiny_encoder, passages[3:], chunk_passages=1, progress=False)
    monkeypatch.setattr(store._ChunkWriter, "write", real)
    assert len(Index(path, model=tiny_encoder)) == 3  # the appended bytes are not committed
    add_passages(path, tiny_encoder, passages[3:], progress=False)
    index = Index(path, model=tiny_encoder, verify=True)
    assert len(index) == len(TEXTS)
    assert [r["id"] for r in map(index.store.record, range(len(TEXTS)))] == [p.id for p in passages]


def test_interrupted_build_leaves_nothing(tmp_path, tiny_encoder, monkeypatch):
    import agrame.index.store as store

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(store, "MetadataDB", boom)  # (the last file a build writes before its rename)
    with pytest.raises(RuntimeError):
        build_index(tiny_encoder, [Passage(str(i), t) for i, t in enumerate(TEXTS)], tmp_path / "ix", progress=False)
    assert list(tmp_path.iterdir()) == []


# -- model agreement -----------------------------------------------------------------------------

def test_model_names_that_load_again(small_index, tiny_encoder, make_tiny_encoder):
    manifest = json.loads((small_index / "manifest.json").read_text())
    assert index_model_name({"model": {"source": "zero-shot:all-MiniLM-L6-v2"}}) == "zero-shot"
    assert index_model_name({"model": {"source": "default:agrame-minilm"}}) == "default"
    zero_shot = {**manifest, "model": {**manifest["model"], "name": "zero-shot"}}
    with pytest.raises(IndexFolderError, match="search it with --model zero-shot$"):
        check_model(zero_shot, make_tiny_encoder(seed=3), small_index)
    default = {**manifest, "model": {**manifest["model"], "name": "default"}}
    with pytest.raises(IndexFolderError, match="without --model"):
        check_model(default, make_tiny_encoder(seed=3), small_index)


def test_size_per_token(small_index):
    manifest = json.loads((small_index / "manifest.json").read_text())
    files = manifest["files"]
    assert manifest["token_offsets"] == "tokenizer" and "tokens.bin" not in files
    assert not (small_index / "tokens.bin").exists()
    per_token = (files["codes.bin"]["size"] + files["residuals.bin"]["size"]) / manifest["num_tokens"]
    assert per_token == 2 + 16 * 2 / 8  # uint16 id, 2-bit residual of 16 dims


# -- token offsets: recomputed from the text, or stored ---------------------------------------------

LONG = " ".join(["Reefs, lagoons; and atolls!"] * 30) + " The end."


def test_passage_offsets_equal_those_of_encoding(tiny_encoder, marked_encoder):
    # Windowed (doc_maxlen 24 and 64), with and without a [D] marker and punctuation masking.
    for encoder in (tiny_encoder, marked_encoder, tiny_encoder.with_settings(mask_punctuation=False)):
        texts = TEXTS + [LONG, "", "?!"]
        encoded = encoder.encode_passages(texts)
        for e, offsets in zip(encoded, encoder.passage_offsets(texts)):
            assert torch.equal(e.offsets, offsets)


def test_recomputed_offsets_search_like_stored_ones(tmp_path, tiny_encoder):
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS + [LONG])]
    spans = [Passage("s", TEXTS[0], ((0, 11), ((12, 19), (33, 43))))]
    build_index(tiny_encoder, passages + spans, tmp_path / "lean", progress=False)
    lean = Index(tmp_path / "lean", model=tiny_encoder)
    build_compressed(tiny_encoder, passages + spans, tmp_path / "stored", codec=lean.store.codec, progress=False,
                     store_offsets=True)
    stored = Index(tmp_path / "stored", model=tiny_encoder)
    assert (tmp_path / "stored" / "tokens.bin").exists() and not (tmp_path / "lean" / "tokens.bin").exists()
    pids = np.arange(len(lean))
    a, b = lean.store.corpus(pids), stored.store.corpus(pids)
    assert torch.equal(a.offsets, b.offsets) and torch.equal(a.token_sentence, b.token_sentence)
    c = lean.store.corpus(pids[::-1], with_offsets=False)  # from sentence_tokens.bin, no tokenizer run
    assert torch.equal(c.token_sentence, stored.store.corpus(pids[::-1]).token_sentence)
    assert (c.offsets == 0).all() and (a.token_sentence >= 0).sum() > len(pids)
    for granularity in ("passage", "sentence", "span"):
        for settings_ in ({}, {"exact": True}):
            a = lean.search("coral reef lagoons", granularity, top_k=None, **settings_)
            assert a == stored.search("coral reef lagoons", granularity, top_k=None, **settings_)
    assert lean.explain("coral reef", "0") == stored.explain("coral reef", "0")
    # An index that stores offsets keeps storing them when passages are added.
    add_passages(tmp_path / "stored", tiny_encoder, [Passage("more", TEXTS[2])], progress=False)
    grown = Index(tmp_path / "stored", model=tiny_encoder, verify=True)
    assert grown.store.tokens.shape[0] == grown.store.num_tokens
    # "more" repeats passage "2": the two tie (to float noise, which decides their order).
    top = grown.search("bleaching algae", "sentence", top_k=2)
    assert {h.passage_id for h in top} == {"2", "more"} and abs(top[0].score - top[1].score) < 1e-4


def test_offsets_that_the_tokenizer_does_not_reproduce_are_refused(tmp_path, tiny_encoder):
    items, corpus, _ = _synthetic(0, passages=10)
    with pytest.raises(IndexFolderError, match="token offsets differ"):
        build_compressed(tiny_encoder, items, tmp_path / "ix", encoded=corpus, progress=False)
    assert not (tmp_path / "ix").exists()
    # Vectors encoded by the index's own model (e.g. cached) pass the check.
    passages = [Passage(str(i), t) for i, t in enumerate(TEXTS)]
    cached = EncodedCorpus.build(passages, tiny_encoder.encode_passages(TEXTS))
    build_compressed(tiny_encoder, passages, tmp_path / "ok", encoded=cached, progress=False)
    assert Index(tmp_path / "ok", model=tiny_encoder).search("coral", "sentence", top_k=1)


def test_recomputed_token_counts_are_checked(small_index, tiny_encoder):
    from agrame.index import Store

    with pytest.raises(IndexFolderError, match="open it with the model"):
        Store(small_index).corpus(np.array([0]))
    short = Store(small_index, tokenize=lambda texts: [o[:-1] for o in tiny_encoder.passage_offsets(texts)])
    with pytest.raises(IndexFolderError, match="passage '1' has .* token vectors but the model's tokenizer gives"):
        short.corpus(np.array([1]))
    # Passage and sentence searches need no offsets, so no tokenizer.
    assert len(Store(small_index).corpus(np.array([0, 1]), with_sentences=False)) == 2
    assert len(Store(small_index).corpus(np.array([0, 1]), with_offsets=False).sentences) > 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), max_size=4), min_size=1, max_size=5))
def test_token_sentences_from_rows_matches_a_loop(passages):
    from agrame.index.store import token_sentences_from_rows

    doclens, counts, rows, expected = [], [], [], []
    for sentences in passages:  # (gap before, length) per sentence, then a tail of 1
        tokens, table = [], []
        for gap, length in sentences:
            tokens += [-1] * gap
            table.append((len(tokens), len(tokens) + length) if length else (0, 0))
            tokens += [len(table) - 1] * length
        tokens.append(-1)
        doclens.append(len(tokens)), counts.append(len(sentences))
        rows += table
        expected += tokens
    got = token_sentences_from_rows(np.array(rows, dtype=np.int32).reshape(-1, 2), np.array(counts), np.array(doclens))
    assert got.tolist() == expected


def test_overwrite_and_exists(small_index, tiny_encoder):
    with pytest.raises(IndexFolderError, match="already exists"):
        build_index(tiny_encoder, [Passage("x", "text")], small_index, progress=False)
    build_index(tiny_encoder, [Passage("x", "text here")], small_index, overwrite=True, progress=False)
    assert len(Index(small_index, model=tiny_encoder)) == 1
    shutil.rmtree(small_index)


def test_sentence_rows_refuse_a_gap_inside_a_sentence():
    from agrame.index.store import _sentence_rows

    def rows(offsets):
        enc = [EncodedPassage(torch.zeros((len(offsets), 4)), torch.tensor(offsets))]
        return _sentence_rows([Passage("p", "ab cd. ef")], enc, np.array([[0, 6], [7, 9]]), np.array([2]),
                              np.array([len(offsets)]))

    assert rows([(0, 0), (0, 2), (3, 5), (5, 6), (7, 9)]).tolist() == [[1, 4], [4, 5]]
    with pytest.raises(IndexFolderError, match="passage 'p': the tokens of a sentence are not consecutive"):
        rows([(0, 0), (0, 2), (3, 3), (3, 5), (7, 9)])  # a zero-width token between two of sentence 0


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), share=st.sampled_from([0.01, 0.05, 0.2, 0.5, 0.9]), k=st.integers(1, 30))
def test_filtered_search_equals_the_filtered_exhaustive_scan(tmp_path_factory, tiny_encoder, seed, share, k):
    """Issue 41's filter test: with budgets that cover every allowed passage, a filtered staged search is
    the filtered exhaustive scan (same units, same order); with the default budgets it still fills k
    whenever k passages match, from allowed passages only."""
    items, corpus, rng = _synthetic(seed)
    allowed = rng.random(len(items)) < share
    items = [Passage(p.id, p.text, metadata={"ok": bool(a)}) for p, a in zip(items, allowed)]
    path = tmp_path_factory.mktemp("ix") / "ix"
    build_compressed(tiny_encoder, items, path, encoded=corpus, progress=False, store_offsets=True)
    index = Index(path, model=tiny_encoder)
    q = torch.from_numpy(_unit(rng.normal(size=(5, 16))).astype(np.float32))
    matching = {p.id for p, a in zip(items, allowed) if a}
    for granularity in ("passage", "sentence"):
        exact = index.search_vectors(q, q, granularity, top_k=k, exact=True, filter={"ok": True})
        staged = index.search_vectors(q, q, granularity, top_k=k, nprobe=10_000, ncandidates=10_000,
                                      filter={"ok": True})
        assert [(h.passage_id, h.start) for h in staged] == [(h.passage_id, h.start) for h in exact]
        default = index.search_vectors(q, q, granularity, top_k=k, filter={"ok": True})
        assert {h.passage_id for h in default} <= matching
        if granularity == "passage":
            assert len(default) == min(k, len(matching))


@pytest.mark.parametrize("granularity", ["passage", "sentence"])
def test_lazily_decompressed_vectors_score_as_the_decompressed_corpus(tmp_path, tiny_encoder, monkeypatch, granularity):
    from agrame.index.codec import CompressedVectors
    from agrame.ranker import score_corpus

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    store = Index(tmp_path / "ix", model=tiny_encoder).store
    pids = np.array([3, 0, 2, 1])
    eager, lazy = store.corpus(pids), store.corpus(pids, lazy=True)
    assert isinstance(lazy.vectors, CompressedVectors) and lazy.num_tokens == eager.num_tokens
    rows = np.array([0, 5, 2])
    assert torch.equal(lazy.vectors[1:7], eager.vectors[1:7]) and torch.equal(lazy.vectors[rows], eager.vectors[rows])
    monkeypatch.setattr(CompressedVectors, "chunk_tokens", 3)  # several chunks, a passage never split
    q = tiny_encoder.encode_query("coral reef", "Q").vectors
    s = tiny_encoder.encode_query("coral reef", "Q'").vectors
    a = score_corpus(q, s, eager, granularity, precise=True)
    b = score_corpus(q, s, lazy, granularity, precise=True)
    assert torch.equal(a.passage, b.passage)
    if granularity == "sentence":
        assert torch.equal(a.sentence, b.sentence)


def test_lazy_corpora_join_compressed_and_unread(tmp_path, tiny_encoder):
    # Corpora joined (EncodedCorpus.concat: the benchmarks' cached shards; store.gather does it in one pass):
    # the vectors stay compressed, the records unread until a hit asks, and the joined corpus scores as its
    # parts' rows do.
    from agrame.corpus import EncodedCorpus
    from agrame.index.codec import CompressedVectors, ResidualCodec, same_codec
    from agrame.ranker import score_corpus

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    store = Index(tmp_path / "ix", model=tiny_encoder).store
    parts = [store.corpus(np.array([3, 0]), with_offsets=False, lazy=True),
             store.corpus(np.array([2]), with_offsets=False, lazy=True)]
    read = []
    record = store.record
    store.record = lambda p: read.append(p) or record(p)
    joined = EncodedCorpus.concat(parts)
    assert isinstance(joined.vectors, CompressedVectors) and read == []
    whole = store.corpus(np.array([3, 0, 2]), with_offsets=False)
    assert torch.equal(joined.vectors.decompress(), whole.vectors)
    for name in ("token_passage", "token_sentence", "sentences", "sentence_passage", "passage_starts"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    assert joined.ids[2] == "p2" and read == [2]
    assert list(joined.ids) == ["p3", "p0", "p2"] and joined.ids[-1] == "p2" and joined.ids[1:] == ["p0", "p2"]
    assert joined.texts[0] == TEXTS[3] and len(joined.texts) == 3
    with pytest.raises(IndexError):
        joined.ids[3]
    q = tiny_encoder.encode_query("coral reef", "Q").vectors
    for granularity in ("passage", "sentence"):
        a, b = score_corpus(q, q, joined, granularity), score_corpus(q, q, whole, granularity)
        assert torch.allclose(a.passage, b.passage, atol=1e-5)
    # Only vectors of one codec join: another codec's would decode wrongly.
    codec = store.codec
    other = ResidualCodec(codec.centroids, codec.cutoffs, codec.weights * 2, codec.nbits)
    assert same_codec(codec, ResidualCodec(codec.centroids.copy(), codec.cutoffs, codec.weights, codec.nbits))
    assert not same_codec(codec, other)
    with pytest.raises(ValueError, match="different codecs"):
        CompressedVectors.concat([parts[0].vectors, CompressedVectors(other, parts[1].vectors.codes,
                                                                      parts[1].vectors.packed)])


def test_chunks_scored_on_two_threads_score_as_on_one(tmp_path, tiny_encoder, monkeypatch):
    # With torch's threads at 2, lazily decompressed chunks are scored on a pool of 2 (agrame.ranker):
    # the same scores bit for bit, and spans in the same order, as one thread gives.
    import threading

    from agrame import scoring
    from agrame.index.codec import CompressedVectors
    from agrame.ranker import score_corpus

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    store = Index(tmp_path / "ix", model=tiny_encoder).store
    corpus = store.corpus(np.array([3, 0, 2, 1]), lazy=True)
    monkeypatch.setattr(CompressedVectors, "chunk_tokens", 4)
    table = {p: [((0, 8),), ((2, 14), (16, 20))] for p in range(4)}
    q = tiny_encoder.encode_query("coral reef", "Q").vectors
    s = tiny_encoder.encode_query("coral reef", "Q'").vectors
    threads = set()
    similarity = scoring.similarity
    run_max = CompressedVectors.run_max  # passages: scored on their codes (scoring.compressed_run_max)
    monkeypatch.setattr(scoring, "similarity",
                        lambda *a, **k: threads.add(threading.current_thread().name) or similarity(*a, **k))
    monkeypatch.setattr(CompressedVectors, "run_max",
                        lambda *a, **k: threads.add(threading.current_thread().name) or run_max(*a, **k))
    before = torch.get_num_threads()
    try:
        for granularity, sub in (("passage", None), ("sentence", s), ("sentence", q), ("span", s)):
            torch.set_num_threads(1)
            one = score_corpus(q, sub, corpus, granularity, span_table=table)
            assert not any(name.startswith("agrame-score") for name in threads)
            torch.set_num_threads(2)
            two = score_corpus(q, sub, corpus, granularity, span_table=table)
            assert any(name.startswith("agrame-score") for name in threads)
            threads.clear()
            assert torch.equal(one.passage, two.passage)
            if granularity == "sentence":
                assert torch.equal(one.sentence, two.sentence)
            assert one.spans == two.spans and (granularity != "span" or len(one.spans) == 8)
    finally:
        torch.set_num_threads(before)


def test_one_query_for_both_scores_sentences_and_passages_as_two_queries_do(tmp_path, tiny_encoder, monkeypatch):
    # score_corpus with one query tensor for passage and sentence takes the passage maxima from the
    # sentences' (scoring.nested_segment_maxsim); handed an equal copy it scores tokens twice as before:
    # the same scores, bit for bit, over chunk boundaries, eagerly and lazily decompressed.
    from agrame.index.codec import CompressedVectors
    from agrame.ranker import score_corpus

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", progress=False)
    store = Index(tmp_path / "ix", model=tiny_encoder).store
    pids = np.array([3, 0, 2, 1])
    monkeypatch.setattr(CompressedVectors, "chunk_tokens", 5)
    q = tiny_encoder.encode_query("coral reef", "Q").vectors
    for corpus in (store.corpus(pids), store.corpus(pids, lazy=True), store.corpus(pids, with_offsets=False, lazy=True)):
        assert bool((corpus.token_sentence < 0).any())  # [CLS] and [D] are in no sentence
        for chunk in (5, 10_000):
            shared = score_corpus(q, q, corpus, "sentence", chunk_tokens=chunk)
            apart = score_corpus(q, q.clone(), corpus, "sentence", chunk_tokens=chunk)
            assert torch.equal(shared.passage, apart.passage) and torch.equal(shared.sentence, apart.sentence)
            alone = score_corpus(q, None, corpus, "passage", chunk_tokens=chunk).passage
            if hasattr(corpus.vectors, "run_max"):  # the compiled loop sums in its own order: a few ulps apart
                assert torch.allclose(shared.passage, alone, rtol=0, atol=1e-5)
            else:
                assert torch.equal(shared.passage, alone)


def test_the_three_line_quick_start_builds_searches_adds_and_deletes(tmp_path, tiny_encoder):
    # issue 63: an index from a list of texts and dicts, searched, grown and shrunk on the same object
    from agrame.index import Index

    index = Index.build(["Coral reefs bleach when the water warms. Algae leave the coral.",
                         {"id": "gbr", "text": "The Great Barrier Reef is large.", "metadata": {"sea": "Coral"}}],
                        tmp_path / "quick", model=tiny_encoder, progress=False)
    assert sorted(index.ids()) == ["0", "gbr"] and index.metadata("gbr") == {"sea": "Coral"}
    hits = index.search("Why do corals bleach?", granularity="sentence", top_k=3)
    assert hits and {h.passage_id for h in hits} <= {"0", "gbr"}
    index.add([{"id": "mangroves", "text": "Mangroves protect coasts."}])
    index.delete(["gbr"])
    assert sorted(index.ids()) == ["0", "mangroves"]
    with pytest.raises(ValueError):  # a second build at the same path: not over an index unless asked
        Index.build(["another"], tmp_path / "quick", model=tiny_encoder, progress=False)
    rebuilt = Index.build(["another"], tmp_path / "quick", model=tiny_encoder, progress=False, overwrite=True)
    assert rebuilt.ids() == ["0"]


def test_every_hit_carries_its_passages_metadata(tmp_path, tiny_encoder, capsys):
    # issue 63: one shape everywhere — the local and sharded index, the in-memory ranker and the CLI's jsonl
    import json

    from agrame import Ranker
    from agrame.index import Index
    from agrame.index.sharded import build_sharded, open_index
    from agrame_app.cli import main

    passages = [{"id": "a", "text": "Coral reefs bleach when the water warms.", "metadata": {"sea": "Coral"}},
                {"id": "b", "text": "Mangroves protect coasts from storms."}]
    passages += [{"id": f"f{i}", "text": f"Filler passage {i} about fish.", "metadata": {"n": i}} for i in range(8)]
    want = {"a": {"sea": "Coral"}, "b": {}, **{f"f{i}": {"n": i} for i in range(8)}}
    index = Index.build(passages, tmp_path / "ix", model=tiny_encoder, progress=False)
    build_sharded(tiny_encoder, [Passage(p["id"], p["text"], metadata=p.get("metadata")) for p in passages],
                  tmp_path / "sh", 2, progress=False)
    for found in (index, open_index(tmp_path / "sh", model=tiny_encoder)):
        for granularity in ("passage", "sentence"):
            hits = found.search("reefs", granularity=granularity, top_k=5)
            assert hits and all(h.metadata == want[h.passage_id] for h in hits)
        assert all(h.metadata == want[h.passage_id] for h in found.rank_ids("reefs", ["a", "b"]))
    hits = Ranker(tiny_encoder).rank("reefs", passages, granularity="sentence")
    assert hits and all(h.metadata == want[h.passage_id] for h in hits)
    tiny_encoder.save(tmp_path / "model")
    assert main(["search", "-i", str(tmp_path / "ix"), "-m", str(tmp_path / "model"), "-f", "jsonl", "reefs"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert all(r["metadata"] == want[r["passage_id"]] for line in lines for r in line.get("results", [line]))
