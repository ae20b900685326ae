"""Every scorer against a naive Python loop on random tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agrame import scoring

NEG = -math.inf


@st.composite
def sims(draw, negative_only: bool = False):
    lq = draw(st.integers(1, 6))
    n = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand((lq, n), generator=g, dtype=torch.float64) * 2 - 1
    if negative_only or draw(st.booleans()):
        sim = -sim.abs() - 0.01  # all similarities negative: a 0/1-multiplied mask would win
    return sim, g


def naive_maxsim(sim, doc_mask=None, query_mask=None):
    lq, n = sim.shape
    total = 0.0
    for i in range(lq):
        if query_mask is not None and not query_mask[i]:
            continue
        best = NEG
        for j in range(n):
            if doc_mask is None or doc_mask[j]:
                best = max(best, float(sim[i, j]))
        total += best
    return total


def close(a, b):
    if math.isinf(b):
        return math.isinf(a) and (a > 0) == (b > 0)
    return abs(a - b) < 1e-9


@given(sims(), st.data())
@settings(max_examples=200, deadline=None)
def test_maxsim_matches_loop(sim_g, data):
    sim, g = sim_g
    lq, n = sim.shape
    doc_mask = torch.rand(n, generator=g) < data.draw(st.floats(0.1, 1.0))
    doc_mask[data.draw(st.integers(0, n - 1))] = True
    query_mask = torch.rand(lq, generator=g) < 0.7
    assert close(float(scoring.maxsim(sim)), naive_maxsim(sim))
    assert close(float(scoring.maxsim(sim, doc_mask)), naive_maxsim(sim, doc_mask))
    assert close(float(scoring.maxsim(sim, doc_mask, query_mask)), naive_maxsim(sim, doc_mask, query_mask))


@given(sims(), st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_span_maxsim_matches_loop(sim_g, num_spans):
    sim, g = sim_g
    n = sim.shape[1]
    masks = torch.rand((num_spans, n), generator=g) < 0.4
    masks[0] = False
    masks[0, int(torch.randint(n, (1,), generator=g))] = True  # a single-token span
    if num_spans > 1:
        masks[-1] = False  # an empty span scores -inf, never 0
    got = scoring.span_maxsim(sim, masks)
    for s in range(num_spans):
        expected = naive_maxsim(sim, masks[s]) if masks[s].any() else NEG
        assert close(float(got[s]), expected)


@given(sims(), st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_segment_maxsim_matches_loop_and_span_maxsim(sim_g, num_segments):
    sim, g = sim_g
    n = sim.shape[1]
    ids = torch.randint(-1, num_segments, (n,), generator=g)
    got = scoring.segment_maxsim(sim, ids, num_segments)
    one_hot = torch.stack([ids == s for s in range(num_segments)])
    via_mask = scoring.span_maxsim(sim, one_hot)
    for s in range(num_segments):
        expected = naive_maxsim(sim, ids == s) if (ids == s).any() else NEG
        assert close(float(got[s]), expected)
        assert close(float(via_mask[s]), expected)


@given(sims(), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_subquery_maxsim_matches_loop(sim_g, m):
    sim, g = sim_g
    lq, n = sim.shape
    query_masks = torch.rand((m, lq), generator=g) < 0.5
    doc_mask = torch.ones(n, dtype=torch.bool)
    doc_mask[torch.rand(n, generator=g) < 0.3] = False
    doc_mask[0] = True
    got = scoring.subquery_maxsim(sim, query_masks, doc_mask)
    for k in range(m):
        assert close(float(got[k]), naive_maxsim(sim, doc_mask, query_masks[k]))


@given(sims(negative_only=True))
@settings(max_examples=50, deadline=None)
def test_negative_similarities_are_not_masked_to_zero(sim_g):
    sim, _ = sim_g
    n = sim.shape[1]
    mask = torch.zeros((1, n), dtype=torch.bool)
    mask[0, 0] = True
    # Every similarity is negative, so the true score is negative; a multiplied mask gives 0.
    assert float(scoring.span_maxsim(sim, mask)[0]) < 0
    assert float(scoring.segment_maxsim(sim, torch.zeros(n, dtype=torch.long), 1)[0]) < 0


def test_batched_maxsim_over_passages():
    g = torch.Generator().manual_seed(3)
    sim = torch.randn((4, 5, 7), generator=g, dtype=torch.float64)
    mask = torch.rand((4, 7), generator=g) < 0.6
    mask[:, 0] = True
    got = scoring.maxsim(sim, mask)
    for p in range(4):
        assert close(float(got[p]), naive_maxsim(sim[p], mask[p]))


def test_combined_score_broadcasts_alpha():
    spans = torch.tensor([1.0, 2.0, 3.0])
    passages = torch.tensor([10.0, 10.0, 20.0])
    assert scoring.combined_score(spans, passages, 0.5).tolist() == [6.0, 7.0, 13.0]
    assert scoring.combined_score(spans, passages, 0.0).tolist() == [1.0, 2.0, 3.0]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 12), st.integers(1, 4), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_subquery_segment_maxsim_matches_naive_loop(lq, n, n_seg, n_sub, seed):
    g = torch.Generator().manual_seed(seed)
    sim = torch.randn(lq, n, generator=g)
    seg = torch.randint(-1, n_seg, (n,), generator=g)
    masks = torch.rand(n_sub, lq, generator=g) > 0.4
    got = scoring.subquery_segment_maxsim(sim, masks, seg, n_seg)
    per_token = scoring.segment_max(sim, seg, n_seg)
    for m in range(n_sub):
        for s in range(n_seg):
            cols = (seg == s).nonzero().flatten()
            if cols.numel() == 0:
                assert got[m, s] == float("-inf")
                continue
            expected = sum(float(sim[i, cols].max()) for i in range(lq) if masks[m, i])
            assert float(got[m, s]) == pytest.approx(expected, abs=1e-5)
            assert float(per_token[0, s]) == pytest.approx(float(sim[0, cols].max()))


@given(sims(), st.integers(1, 6), st.integers(1, 4), st.booleans())
@settings(max_examples=300, deadline=None)
def test_nested_segment_maxsim_equals_two_segment_maxsims_bit_for_bit(sim_g, num_segments, num_groups, masked):
    # Segments in order inside groups (sentences of passages), some tokens in no segment (a passage's
    # [CLS] and marker): the scores are segment_maxsim's over the tokens exactly, not just closely.
    sim, g = sim_g
    sim = sim.float()
    n = sim.shape[1]
    segment_group = torch.sort(torch.randint(0, num_groups, (num_segments,), generator=g)).values
    token_groups = torch.sort(torch.randint(0, num_groups, (n,), generator=g)).values
    # a token's segment: one of its group's, or none (−1)
    token_segment = torch.full((n,), -1)
    for j in range(n):
        mine = (segment_group == token_groups[j]).nonzero().flatten()
        if len(mine) and torch.rand(1, generator=g) < 0.8:
            token_segment[j] = mine[torch.randint(len(mine), (1,), generator=g)]
    query_mask = torch.rand(sim.shape[0], generator=g) < 0.7 if masked else None
    seg, grp = scoring.nested_segment_maxsim(sim, token_segment, num_segments, segment_group, token_groups,
                                             num_groups, query_mask)
    assert torch.equal(seg, scoring.segment_maxsim(sim, token_segment, num_segments, query_mask))
    assert torch.equal(grp, scoring.segment_maxsim(sim, token_groups, num_groups, query_mask))
    for p in range(num_groups):
        if not (token_groups == p).any() and (query_mask is None or query_mask.any()):
            assert grp[p] == NEG


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 7), st.integers(1, 6), st.integers(1, 4),
       st.integers(0, 2**31 - 1))
@settings(max_examples=100, deadline=None)
def test_padded_maxsim_matches_a_naive_loop(b, lq, n, w, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    q, docs = torch.randn(b, lq, 3, generator=g), torch.randn(n, w, 3, generator=g)
    q_mask, doc_mask = torch.rand(b, lq, generator=g) > 0.3, torch.rand(n, w, generator=g) > 0.3
    doc_mask[:, 0] = True  # a document has a token
    got = scoring.padded_maxsim(q, q_mask, docs, doc_mask, docs_per_chunk=chunk)
    for i in range(b):
        for j in range(n):
            expected = sum(max(float(q[i, t] @ docs[j, u]) for u in range(w) if doc_mask[j, u])
                           for t in range(lq) if q_mask[i, t])
            assert math.isclose(float(got[i, j]), expected, rel_tol=1e-5, abs_tol=1e-5)


def test_padded_maxsim_keeps_every_tensor_on_its_device():
    # the exact mining scan runs it on a GPU: no tensor of its own may be made on the CPU
    from test_training_scale import OneDeviceMode

    q, docs = torch.zeros(2, 3, 4, device="meta"), torch.zeros(5, 6, 4, device="meta")
    with OneDeviceMode():
        out = scoring.padded_maxsim(q, torch.ones(2, 3, dtype=torch.bool, device="meta"), docs,
                                    torch.ones(5, 6, dtype=torch.bool, device="meta"), docs_per_chunk=2)
    assert out.shape == (2, 5) and out.device.type == "meta"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 8), st.integers(1, 12), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_segment_max_by_runs_matches_naive_loop_and_scatter(lq, runs, n_seg, longest, float64, seed):
    # Ids in runs (passages, sentences with [CLS]/marker tokens at −1 between them), a segment
    # possibly in several runs or in none, −inf entries: the run-wise max equals a naive loop's and
    # the token-wise scatter's bit for bit.
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (runs,), generator=g)
    run_ids = torch.randint(-1, n_seg, (runs,), generator=g)
    seg = torch.repeat_interleave(run_ids, lengths)
    sim = torch.randn(lq, int(lengths.sum()), generator=g, dtype=torch.float64 if float64 else torch.float32)
    sim[torch.rand(sim.shape, generator=g) < 0.1] = float("-inf")
    got = scoring.segment_max(sim, seg, n_seg)
    out = torch.full((lq, n_seg), float("-inf"), dtype=sim.dtype)
    scattered = out.scatter_reduce(1, seg.clamp_min(0).unsqueeze(0).expand(lq, -1),
                                   torch.where(seg >= 0, sim, torch.tensor(float("-inf"), dtype=sim.dtype)),
                                   reduce="amax", include_self=True)
    assert torch.equal(got, scattered)
    for s in range(n_seg):
        cols = (seg == s).nonzero().flatten()
        for i in range(lq):
            expected = float("-inf") if cols.numel() == 0 else float(sim[i, cols].max())
            assert float(got[i, s]) == expected


def test_segment_max_takes_the_run_path_for_passages():
    # Long runs in order (one a passage) go through numpy's reduceat; a random order through the scatter.
    sim = torch.randn(3, 400)
    seg = torch.repeat_interleave(torch.arange(8), 50)
    assert scoring._segment_max_by_runs(sim, seg, 8) is not None
    assert scoring._segment_max_by_runs(sim, seg[torch.randperm(400)], 8) is None
    assert torch.equal(scoring.segment_max(sim, seg, 8), torch.stack([sim[:, k * 50:(k + 1) * 50].amax(1)
                                                                       for k in range(8)], 1))


def _naive_run_max(queries, centroids, codes, groups, table, starts):
    width = table.shape[1]
    out = np.full((len(queries), len(starts) - 1), -np.inf)
    for r in range(len(starts) - 1):
        for t in range(starts[r], starts[r + 1]):
            v = np.array(centroids[codes[t]], dtype=np.float64)
            for g in range(groups.shape[1]):
                v[g * width:(g + 1) * width] += table[groups[t, g]]
            v /= max(np.linalg.norm(v), 1e-12)
            for i in range(len(queries)):
                out[i, r] = max(out[i, r], float(np.dot(queries[i].astype(np.float64), v)))
    return out


@pytest.mark.parametrize("width, rows, group_dtype", [(4, 256, np.uint8), (8, 256, np.uint8), (1, 256, np.uint8),
                                                      (2, 96, np.int64)])
@pytest.mark.parametrize("compiled", [True, False])
def test_compressed_run_max_equals_the_naive_loop(width, rows, group_dtype, compiled):
    # A scalar codec's byte tables (4 / 8 / 1 dimensions a byte) and a product codec's stacked codebooks;
    # runs of every length, an empty one included (−inf), and the compiled loop beside the array path.
    if compiled and not scoring.compiled_runs():
        pytest.fail("numba is a core dependency: the compiled loop must be there")
    rng = np.random.default_rng(width)
    d, n = 16, 97
    centroids = rng.standard_normal((11, d)).astype(np.float32)
    codes = rng.integers(0, 11, n).astype(np.uint16)
    groups = rng.integers(0, rows, (n, d // width)).astype(group_dtype)
    table = (0.3 * rng.standard_normal((rows, width))).astype(np.float32)
    starts = np.array([0, 5, 5, 6, 40, 97])
    queries = torch.nn.functional.normalize(torch.randn(7, d, generator=torch.Generator().manual_seed(width)), dim=1)
    got = scoring.compressed_run_max(queries, centroids, codes, groups, table, starts, compiled=compiled)
    want = _naive_run_max(queries.numpy(), centroids, codes, groups, table, starts)
    assert got.shape == (7, 5) and got.dtype == torch.float32
    assert torch.isinf(got[:, 1]).all() and (got[:, 1] < 0).all()
    finite = np.isfinite(want)
    assert np.allclose(got.numpy()[finite], want[finite], atol=1e-5)


def test_compressed_run_max_scores_a_codec_as_its_decompression_does():
    # The codecs' table form rebuilds exactly what they decompress: scores of decompress-then-dot.
    from agrame.index.codec import ProductCodec, ResidualCodec

    rng = np.random.default_rng(0)
    sample = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((600, 32)).astype(np.float32)), dim=1)
    for codec in (ResidualCodec.train(sample.numpy(), 8, 2, niter=2), ProductCodec.train(sample.numpy(), 8, 6, 8, niter=2)):
        codes, packed = codec.compress(sample[:50].numpy())
        q = sample[50:54]
        starts = np.array([0, 20, 21, 50])
        got = scoring.compressed_run_max(q, *codec.table_form(codes, packed), starts)
        owners = torch.repeat_interleave(torch.arange(3), torch.from_numpy(np.diff(starts)))
        want = scoring.segment_max(q @ codec.decompress(codes, packed).T, owners, 3)
        assert torch.allclose(got, want, atol=1e-5)


def _laid_out(table: torch.Tensor, layout: str) -> torch.Tensor:
    # "columns": the [Lq, K] table as scoring.centroid_scores lays it out (a view of [K, Lq] memory)
    return table.T.contiguous().T if layout == "columns" else table


def test_centroid_scores_are_the_similarity_laid_out_by_centroid():
    rng = np.random.default_rng(3)
    q = torch.from_numpy(rng.standard_normal((5, 8)).astype(np.float32))
    c = torch.from_numpy(rng.standard_normal((30, 8)).astype(np.float32))
    cs = scoring.centroid_scores(q, c)
    assert cs.shape == (5, 30) and cs.T.is_contiguous()
    assert torch.allclose(cs, scoring.similarity(q, c), atol=1e-6)


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("compiled", [True, False])
def test_lookup_maxsim_equals_the_naive_loop(compiled, layout):
    # Runs anywhere in the codes (out of order, overlapping, empty): Σ_i max_t table[i, codes[t]].
    rng = np.random.default_rng(1)
    table = _laid_out(torch.from_numpy(rng.standard_normal((6, 40)).astype(np.float32)), layout)
    codes = rng.integers(0, 40, 300).astype(np.uint16)
    lo = np.array([250, 0, 10, 7, 299, 120])
    hi = np.array([300, 12, 10, 30, 300, 121])
    got = scoring.lookup_maxsim(table, codes, lo, hi, compiled=compiled)
    for r in range(len(lo)):
        if lo[r] == hi[r]:
            assert got[r] == float("-inf")
        else:
            want = sum(max(float(table[i, codes[t]]) for t in range(lo[r], hi[r])) for i in range(6))
            assert math.isclose(float(got[r]), want, abs_tol=1e-5)


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("filtered", [False, True])
def test_probed_maxsim_equals_the_naive_loop(compiled, filtered, layout):
    # Inverted lists (some empty, passages shared between lists): each passage of the probed lists once,
    # scored Σ_i max over the probed centroids whose list holds it; a keep mask drops passages first.
    rng = np.random.default_rng(2)
    K, N = 12, 50
    lists = [sorted(rng.choice(N, rng.integers(0, 9), replace=False).tolist()) for _ in range(K)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    pids = np.array([p for x in lists for p in x], dtype=np.int32)
    table = _laid_out(torch.from_numpy(rng.standard_normal((5, K)).astype(np.float32)), layout)
    keep = rng.random(N) < 0.6 if filtered else None
    for probe in (np.array([3, 0, 7, 11, 5]), np.arange(K), np.array([], dtype=np.int64)):
        got_pids, got = scoring.probed_maxsim(table, probe, offsets, pids, N, keep, compiled=compiled)
        want = {}
        for c in probe.tolist():
            for p in lists[c]:
                if keep is None or keep[p]:
                    want.setdefault(p, []).append(c)
        assert sorted(got_pids.tolist()) == sorted(want) and len(got_pids) == len(want)
        for p, score in zip(got_pids.tolist(), got.tolist()):
            expect = sum(max(float(table[i, c]) for c in want[p]) for i in range(5))
            assert math.isclose(score, expect, abs_tol=1e-5)
        # the probed rows made once (S shards share them) give the same
        again_pids, again = scoring.probed_maxsim(table, probe, offsets, pids, N, keep, compiled=compiled,
                                                  rows=scoring.probed_rows(table, probe))
        assert again_pids.tolist() == got_pids.tolist() and torch.equal(again, got)
    if compiled:  # the scratch map is left clean for the next call (another index, another size)
        assert (scoring._scratch.slots == -1).all()
