"""Lookup-table scoring (issue 41, item 2) against decompress-then-dot and naive loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame.corpus import Passage
from agrame.index import Index, ResidualCodec, build_index
from agrame.index.codec import pack_bits
from agrame.index.lut import TokenLists, reduce_two_stage, residual_tables, table_scores, warp_candidates

from test_index import TEXTS


def random_codec(rng: np.random.Generator, dim: int, k: int, nbits: int) -> ResidualCodec:
    centroids = rng.standard_normal((k, dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    weights = np.sort(rng.standard_normal(1 << nbits).astype(np.float32) * 0.1)
    cutoffs = (weights[1:] + weights[:-1]) / 2
    return ResidualCodec(centroids, cutoffs, weights, nbits)


@settings(max_examples=40, deadline=None)
@given(nbits=st.sampled_from([1, 2, 4, 8]), groups=st.integers(1, 6), n=st.integers(1, 40),
       length=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_table_scores_equal_decompress_then_dot(nbits, groups, n, length, seed):
    rng = np.random.default_rng(seed)
    dim = 8 * groups
    codec = random_codec(rng, dim, 7, nbits)
    codes = rng.integers(0, 7, n)
    packed = pack_bits(rng.integers(0, 1 << nbits, (n, dim)), nbits)
    q = torch.from_numpy(rng.standard_normal((length, dim)).astype(np.float32))
    query_ids = rng.integers(0, length, n)
    vectors = codec.decompress(codes, packed, normalize=False)  # centroid + residual, as stored
    expected = (q[torch.from_numpy(query_ids)] * vectors).sum(dim=1).numpy()
    centroid_part = (q[torch.from_numpy(query_ids)] * torch.from_numpy(codec.centroids32[codes])).sum(dim=1).numpy()
    got = centroid_part + table_scores(residual_tables(q, codec), query_ids, packed)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_tables_refuse_a_wrong_dimension_or_width():
    codec = random_codec(np.random.default_rng(0), 16, 3, 2)
    with pytest.raises(ValueError, match="dimension"):
        residual_tables(torch.zeros(2, 8), codec)
    with pytest.raises(ValueError, match=r"\[n, 4\]"):
        table_scores(residual_tables(torch.zeros(2, 16), codec), np.zeros(3, dtype=np.int64), np.zeros((3, 5), np.uint8))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), length=st.integers(1, 4), passages=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_two_stage_reduction_equals_a_loop(n, length, passages, seed):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(n).astype(np.float32)
    query_ids = rng.integers(0, length, n)
    owners = rng.integers(0, passages, n) * 3  # positions need not be dense
    imputed = rng.standard_normal(length).astype(np.float32)
    unique, total = reduce_two_stage(scores, query_ids, owners, length, imputed)
    assert list(unique) == sorted(set(owners.tolist()))
    for p, got in zip(unique, total):
        want = 0.0
        for i in range(length):
            mine = [scores[k] for k in range(n) if owners[k] == p and query_ids[k] == i]
            want += max(mine) if mine else imputed[i]
        assert got == pytest.approx(want, abs=1e-5)


@settings(max_examples=30, deadline=None)
@given(doclens=st.lists(st.integers(0, 6), min_size=1, max_size=8), k=st.integers(1, 5), seed=st.integers(0, 1000))
def test_token_lists_group_every_row_by_centroid(doclens, k, seed):
    rng = np.random.default_rng(seed)
    doclens = np.array(doclens)
    starts = np.concatenate([[0], np.cumsum(doclens)])[:-1]
    codes = rng.integers(0, k, int(doclens.sum())).astype(np.uint16)
    lists = TokenLists.build(codes, starts, doclens, k)
    owner = np.repeat(np.arange(len(doclens)), doclens)
    for c in range(k):
        at, counts = lists.probe(np.array([c]))
        assert int(counts[0]) == int((codes == c).sum())
        assert sorted(lists.rows[at].tolist()) == np.flatnonzero(codes == c).tolist()
        assert (lists.owners[at] == owner[lists.rows[at]]).all()


def test_probing_every_centroid_ranks_by_the_unnormalised_maxsim(tmp_path, tiny_encoder):
    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    build_index(tiny_encoder, passages, tmp_path / "ix", nbits=2, progress=False)
    index = Index(tmp_path / "ix", model=tiny_encoder)
    store = index.store
    q = tiny_encoder.encode_query("coral reef bleaching", "Q").vectors.float()
    got = index.warp_candidates(q, store.codec.num_centroids, len(store))
    want = []
    for p in range(len(store)):
        rows = store.token_rows(np.array([p]))
        vectors = store.codec.decompress(store.codes[rows], store.residuals[rows], normalize=False)
        want.append(float((q @ vectors.T).amax(dim=1).sum()))
    order = np.argsort(-np.array(want), kind="stable")
    assert list(got) == list(order)
    # A mask keeps the other passages out; a small budget keeps the best.
    allowed = np.zeros(len(store), dtype=bool)
    allowed[order[1:]] = True
    assert list(index.warp_candidates(q, store.codec.num_centroids, 2, allowed)) == list(order[1:3])


def test_imputation_counts_the_last_probed_centroid_for_an_unmet_query_token():
    codec = random_codec(np.random.default_rng(1), 8, 4, 2)
    # Two passages of one token each: passage 0's on centroid 0, passage 1's on centroid 3.
    codes = np.array([0, 3], dtype=np.uint16)
    packed = pack_bits(np.array([[0, 1, 2, 3, 3, 2, 1, 0], [3, 3, 0, 0, 1, 1, 2, 2]]), 2)
    lists = TokenLists.build(codes, np.array([0, 1]), np.array([1, 1]), 4)
    q = torch.from_numpy(codec.centroids32[[0, 3]])  # query token i nearest its own centroid
    cs = q @ torch.from_numpy(codec.centroids32).T
    full = (q @ codec.decompress(codes, packed, normalize=False).T).numpy()  # [query token, passage]
    imputed = cs.max(dim=1).values.numpy()  # nprobe = 1: the probed centroid's own score
    want = [full[0, 0] + imputed[1], full[1, 1] + imputed[0]]
    got = warp_candidates(q, cs, codec, lists, packed, 1, 2)
    assert list(got) == list(np.argsort(-np.array(want), kind="stable"))
    unique, total = reduce_two_stage(np.array([full[0, 0], full[1, 1]]), np.array([0, 1]), np.array([0, 1]), 2, imputed)
    np.testing.assert_allclose(total, want, rtol=1e-6)
    only_first = warp_candidates(q[:1], cs[:1], codec, lists, packed, 1, 2)
    assert list(only_first) == [0]  # no probed centroid holds passage 1's token: it is no candidate
