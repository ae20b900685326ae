"""Late-interaction scoring: pure tensor functions, no I/O, no model.

All functions take a token similarity matrix ``sim[..., Lq, n]`` (query tokens × passage
tokens) so that one matrix serves the passage score and every span score (AGRaME §3.1:
S(q,p) = Σ_i max_j sim_ij, S'(q,s) = Σ_i max_{j∈s} sim_ij).

Masked positions are *filled* with −inf before the max. Multiplying by a 0/1 mask would
be wrong: with negative similarities a masked 0 would win the max (ColBERT issue #62).
A span with no token therefore scores −inf ("cannot be scored"), never 0.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch

NEG_INF = float("-inf")


def similarity(queries: torch.Tensor, docs: torch.Tensor, precise: bool = False) -> torch.Tensor:
    """``[..., Lq, d] × [..., n, d] → [..., Lq, n]`` dot products (cosine for unit vectors).

    ``precise``: in float64 (and so every score made from them): the same value for a passage
    whatever batch it is scored in. A float32 product is not — BLAS picks its kernel by shape, and a
    passage scored among 7 others or among 5,000 can differ in the last bit — which reorders equal
    scores between a sharded and a single index; float64 sums of float32 products are exact to
    ~1e-16, so once rounded back to float32 they agree."""
    if precise:
        return queries.double() @ docs.double().transpose(-1, -2)
    return queries @ docs.transpose(-1, -2)


def centroid_scores(queries: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """:func:`similarity` ``[Lq, K]`` of a query and an index's centroids, laid out ``[K, Lq]`` in memory (a
    transposed view): the compiled stages (:func:`lookup_maxsim`, :func:`probed_maxsim`) read one
    centroid's similarities to every query token together, and would otherwise copy the whole table into
    that layout at each call — ~1 ms for 16,384 centroids × 32 tokens, once a shard (a diagnostic run)."""
    return similarity(centroids, queries).T


def _query_sum(per_token_max: torch.Tensor, query_mask: torch.Tensor | None) -> torch.Tensor:
    # Summed along contiguous rows: over a transposed view ([Lq, R].T, a compiled run max's) torch picks its
    # reduction order by R, so a passage's score would move by an ulp with how the corpus is chunked (seen
    # on an AMD EPYC: 4 passages at once vs 2 and 2); a contiguous row is summed alike for any R.
    per_token_max = per_token_max.contiguous()
    if query_mask is None:
        return per_token_max.sum(dim=-1)
    # Query-side masking is a sum, so a 0 contributes nothing; torch.where keeps −inf
    # maxima of excluded query tokens from turning the sum into NaN.
    zero = torch.zeros((), dtype=per_token_max.dtype, device=per_token_max.device)
    return torch.where(query_mask.bool(), per_token_max, zero).sum(dim=-1)


def maxsim(
    sim: torch.Tensor,
    doc_mask: torch.Tensor | None = None,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Passage score Σ_i max_j sim[..., i, j] over ``doc_mask`` tokens and ``query_mask`` query tokens.

    ``sim``: ``[..., Lq, n]``; ``doc_mask``: ``[..., n]`` (True = token counts, e.g. not
    padding); ``query_mask``: ``[..., Lq]`` (a sub-query). Returns ``[...]``.
    """
    if doc_mask is not None:
        sim = sim.masked_fill(~doc_mask.bool().unsqueeze(-2), NEG_INF)
    return _query_sum(sim.amax(dim=-1), query_mask)


def token_matches(sim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``sim`` (``[..., Lq, n]``): the maximum :func:`maxsim` sums, and where it lies
    (the passage token each query token matched) — the explanation of a MaxSim score."""
    best = sim.max(dim=-1)
    return best.values, best.indices


def span_maxsim(
    sim: torch.Tensor,
    span_mask: torch.Tensor,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of arbitrary (non-contiguous, overlapping) spans of one passage.

    ``sim``: ``[Lq, n]``; ``span_mask``: ``[S, n]`` boolean; returns ``[S]``.
    Cost O(S·Lq·n); for disjoint contiguous spans use :func:`segment_maxsim`.
    """
    filled = sim.unsqueeze(0).masked_fill(~span_mask.bool().unsqueeze(1), NEG_INF)
    return _query_sum(filled.amax(dim=-1), query_mask)


def segment_max(sim: torch.Tensor, segment_ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Per query token, the max similarity inside each disjoint segment: ``[Lq, num_segments]``.

    ``sim``: ``[Lq, n]``; ``segment_ids``: ``[n]`` in ``[0, num_segments)`` or −1 for
    tokens outside every segment; an empty segment gives −inf. Sub-queries then score
    every segment with one ``[M, Lq] @ [Lq, S]`` product (see :func:`subquery_segment_maxsim`).
    """
    segment_ids = segment_ids.long()
    if sim.device.type == "cpu" and not sim.requires_grad and sim.dim() == 2 and sim.shape[1] > 0:
        by_runs = _segment_max_by_runs(sim, segment_ids, num_segments)
        if by_runs is not None:
            return by_runs
    inside = segment_ids >= 0
    if bool(inside.all()):  # passages: every token has one; skip two copies of sim
        ids, values = segment_ids, sim
    else:
        ids, values = segment_ids[inside], sim[:, inside]
    ids = ids.unsqueeze(0).expand(sim.shape[0], -1)
    out = torch.full((sim.shape[0], num_segments), NEG_INF, dtype=sim.dtype, device=sim.device)
    return out.scatter_reduce(1, ids, values, reduce="amax", include_self=True)


#: A run-wise max pays when runs of equal segment ids are at least this long on average.
MIN_MEAN_RUN = 4


def _segment_max_by_runs(sim: torch.Tensor, segment_ids: torch.Tensor, num_segments: int):
    """:func:`segment_max` for ids that come in runs (a passage's or a sentence's tokens lie together):
    numpy's ``maximum.reduceat`` over each run, then a scatter over the runs only. A max is exact, so
    the result equals the token-wise scatter's bit for bit; it is 4–6× faster (3.5 → 0.5–0.8 ms for
    32 query tokens × 53k tokens in 300 passages, one thread: scatter_reduce walks an index tensor as
    large as ``sim``). None where runs are short (ids in no order): the scatter is then the cheaper."""
    ids = segment_ids.numpy()
    n = ids.shape[0]
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    if (len(starts) + 1) * MIN_MEAN_RUN > n:
        return None
    starts = np.concatenate([np.zeros(1, dtype=starts.dtype), starts])
    per_run = torch.from_numpy(np.maximum.reduceat(sim.numpy(), starts, axis=1))
    run_ids = ids[starts]
    if len(run_ids) == num_segments and np.array_equal(run_ids, np.arange(num_segments)):
        return per_run  # one run a segment, in order (passages)
    keep = run_ids >= 0
    run_ids = torch.from_numpy(run_ids[keep]).unsqueeze(0).expand(sim.shape[0], -1)
    out = torch.full((sim.shape[0], num_segments), NEG_INF, dtype=sim.dtype)
    return out.scatter_reduce(1, run_ids, per_run[:, torch.from_numpy(keep)], reduce="amax", include_self=True)


def segment_maxsim(
    sim: torch.Tensor,
    segment_ids: torch.Tensor,
    num_segments: int,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of disjoint segments (sentences) for the cost of one passage score.

    ``sim``: ``[Lq, n]``; ``segment_ids``: ``[n]`` in ``[0, num_segments)`` or −1 for
    tokens outside every segment. Returns ``[num_segments]``; an empty segment scores −inf.
    Flatten several passages into one ``[Lq, N·n]`` matrix with globally numbered
    segments to score all their sentences in one call.
    """
    return _query_sum(segment_max(sim, segment_ids, num_segments).transpose(0, 1), query_mask)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for each (s, n), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.asarray(starts, dtype=np.int64) - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(total, dtype=np.int64)


def compiled_runs() -> bool:
    """Whether :func:`compressed_run_max` has its compiled loop (numba installed)."""
    from . import kernels

    return kernels.AVAILABLE


class PackedRows(NamedTuple):
    """Table rows kept packed: token ``t``'s group ``g`` reads row ``code + g · stride``, ``code`` the ``g``-th
    ``nbits``-bit value of ``packed[t]`` (one big-endian bit stream: a product or additive codec's codes as
    stored, :func:`agrame.index.codec.pack_codes`)."""

    packed: np.ndarray  # [n, m·nbits/8] uint8
    nbits: int
    count: int  # codes a token (m)
    stride: int  # rows a codebook (2^nbits)

    def rows(self) -> np.ndarray:
        """``[n, m]`` int64 row indices (the array path's): the bit stream read bit by bit."""
        n = len(self.packed)
        bits = np.unpackbits(np.asarray(self.packed, dtype=np.uint8).reshape(n, self.count * self.nbits // 8), axis=1)
        bits = bits[:, :self.count * self.nbits].reshape(n, self.count, self.nbits).astype(np.int64)
        out = bits @ (np.int64(1) << np.arange(self.nbits - 1, -1, -1, dtype=np.int64))
        out += np.arange(self.count, dtype=np.int64) * self.stride
        return out


def compressed_run_max(queries: torch.Tensor, centroids: np.ndarray, codes: np.ndarray, groups,
                       table: np.ndarray, starts: np.ndarray, *, compiled: bool | None = None) -> torch.Tensor:
    """:func:`segment_max` over token vectors kept compressed: ``[Lq, R]``, query token ``i``'s best
    similarity among the tokens of run ``r`` (tokens ``starts[r] … starts[r + 1]``, −inf if none).

    Token ``t`` is ``normalize(centroids[codes[t]] + concat_g table[groups[t, g]])``: a centroid plus one
    table row per group of ``w = table.shape[1]`` dimensions (a scalar codec's byte → ``8 / nbits``
    reconstructed dimensions, a product codec's codeword); where ``w = d`` (an additive codec's codewords)
    ``Σ_g table[groups[t, g]]`` instead. ``groups``: ``[n, G]`` rows, or :class:`PackedRows` (codes as
    stored, read by the compiled loop where they lie). ``compiled`` (default: when numba is there):
    :mod:`agrame.kernels`' loop, which rebuilds one run at a time in the CPU's cache and scores it there
    (a top 100's exact stage, 300 passages and 48k tokens on nq-oracle: 16.6 → 11.2 ms in
    diagnostic runs); else the same math as whole arrays, the reference it is tested
    against. Float32, CPU, for ranking (not :func:`similarity`'s ``precise`` scores)."""
    from . import kernels

    queries = queries.detach().to("cpu", torch.float32).contiguous()
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    if compiled is None:
        compiled = kernels.AVAILABLE
    if compiled:
        out = np.empty((queries.shape[0], len(starts) - 1), dtype=np.float32)
        if isinstance(groups, PackedRows):
            rows, nbits, stride, count = np.ascontiguousarray(groups.packed, dtype=np.uint8), groups.nbits, \
                groups.stride, groups.count
        else:
            rows = np.ascontiguousarray(groups)
            rows = rows.reshape(len(rows), -1)
            nbits, stride, count = 0, 0, rows.shape[1]
        kernels.run_max(queries.numpy(), np.ascontiguousarray(centroids, dtype=np.float32), np.ascontiguousarray(codes),
                        rows, nbits, stride, count, np.ascontiguousarray(table, dtype=np.float32), starts, out)
        return torch.from_numpy(out)
    if isinstance(groups, PackedRows):
        groups = groups.rows()
    n = len(codes)
    vectors = np.take(centroids, np.asarray(codes, dtype=np.int64), axis=0).astype(np.float32)
    groups = np.asarray(groups, dtype=np.int64).reshape(n, -1)
    if table.shape[1] == centroids.shape[1]:  # whole-token rows (an additive code): summed, in group order
        for g in range(groups.shape[1]):
            vectors += np.take(table, groups[:, g], axis=0)
    else:
        vectors += np.take(table, groups.reshape(-1), axis=0).reshape(n, -1)
    vectors = torch.from_numpy(vectors)
    vectors /= vectors.norm(dim=1, keepdim=True).clamp_min_(1e-12)
    lengths = torch.from_numpy(np.diff(starts))
    owners = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return segment_max(similarity(queries, vectors), owners, len(lengths))


def lookup_maxsim(table: torch.Tensor, codes: np.ndarray, lo: np.ndarray, hi: np.ndarray, *,
                  compiled: bool | None = None) -> torch.Tensor:
    """:func:`segment_maxsim` of runs whose similarities are looked up: ``[R]``, run ``r`` (tokens
    ``lo[r] … hi[r]`` of ``codes``) scored Σ_i max_t ``table[i, codes[t]]`` (−inf for an empty run). With
    ``table`` the query's centroid similarities ``[Lq, K]``, a passage's centroid-only score (PLAID's
    stage 3). ``compiled`` (default: when numba is there): one pass over the codes where they lie,
    instead of gathering them and a ``[Lq, n]`` matrix first; else that array path, the reference."""
    from . import kernels

    lo = np.ascontiguousarray(lo, dtype=np.int64)
    hi = np.ascontiguousarray(hi, dtype=np.int64)
    if compiled is None:
        compiled = kernels.AVAILABLE
    if compiled:
        out = np.empty(len(lo), dtype=np.float32)
        kernels.table_maxsim(np.ascontiguousarray(table.detach().cpu().float().numpy().T), np.asarray(codes), lo, hi, out)
        return torch.from_numpy(out)
    lengths = hi - lo
    rows = ranges(lo, lengths)
    gathered = torch.from_numpy(np.asarray(codes[rows], dtype=np.int64))
    owners = torch.repeat_interleave(torch.arange(len(lo)), torch.from_numpy(lengths))
    return segment_maxsim(torch.index_select(table.float(), 1, gathered), owners, len(lo))


_scratch = threading.local()  # per thread: probed_maxsim's passage → slot map (−1 between calls)


def probed_rows(table: torch.Tensor, probe: np.ndarray) -> np.ndarray:
    """``table``'s columns ``probe`` as contiguous rows (``[len(probe), Lq]``), what the compiled
    :func:`probed_maxsim` reads: the same for every index that shares the table and the probe (S shards)."""
    probe = np.asarray(probe, dtype=np.int64)
    return np.ascontiguousarray(table.detach().cpu().float().T[torch.from_numpy(probe)].numpy())


def probed_maxsim(table: torch.Tensor, probe: np.ndarray, offsets: np.ndarray, pids: np.ndarray,
                  num_passages: int, keep: Optional[np.ndarray] = None, *,
                  compiled: bool | None = None, rows: Optional[np.ndarray] = None) -> Tuple[np.ndarray, torch.Tensor]:
    """The passages of inverted lists ``probe`` (``pids[offsets[c]:offsets[c + 1]]``, those with ``keep[p]``
    if given), each once, and their :func:`segment_maxsim` over the probed centroids alone: ``table``
    ``[Lq, K]`` the query's centroid similarities, passage ``p`` scored Σ_i max over the probed ``c`` whose
    list holds it of ``table[i, c]`` (PLAID's stage 2). ``compiled`` (default: when numba is there): one
    pass over the lists (a top 100's 27k pairs on nq-oracle), instead of sorting them (``np.unique``) and
    gathering an ``[Lq, pairs]`` matrix; the passages then come in the order first met, not sorted. Else
    that array path, the reference. ``rows``: :func:`probed_rows` of ``table`` and ``probe``, when already made."""
    from . import kernels

    probe = np.asarray(probe, dtype=np.int64)
    if compiled is None:
        compiled = kernels.AVAILABLE
    if compiled:
        slots = getattr(_scratch, "slots", None)
        if slots is None or len(slots) < num_passages:
            slots = _scratch.slots = np.full(max(num_passages, 1), -1, dtype=np.int32)
        total = int((offsets[probe + 1] - offsets[probe]).sum())
        out_pids = np.empty(total, dtype=np.int64)
        out_scores = np.empty(total, dtype=np.float32)
        if rows is None:
            rows = probed_rows(table, probe)
        n = kernels.probed_maxsim(rows, probe, offsets, pids,
                                  np.zeros(0, dtype=np.bool_) if keep is None else np.asarray(keep, dtype=np.bool_),
                                  slots, out_pids, out_scores)
        return out_pids[:n], torch.from_numpy(out_scores[:n])
    lengths = offsets[probe + 1] - offsets[probe]
    listed = np.asarray(pids[ranges(offsets[probe], lengths)], dtype=np.int64)
    pair_centroid = np.repeat(probe, lengths)
    if keep is not None:
        mask = np.asarray(keep)[listed]
        listed, pair_centroid = listed[mask], pair_centroid[mask]
    unique, local = np.unique(listed, return_inverse=True)
    return unique, segment_maxsim(torch.index_select(table.float(), 1, torch.from_numpy(pair_centroid)),
                                  torch.from_numpy(local), len(unique))


def nested_segment_maxsim(
    sim: torch.Tensor,
    segment_ids: torch.Tensor,
    num_segments: int,
    segment_groups: torch.Tensor,
    token_groups: torch.Tensor,
    num_groups: int,
    query_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of disjoint segments (sentences) *and* of the groups (passages) holding them, for one
    scatter over the tokens: ``(segment scores [num_segments], group scores [num_groups])``.

    ``segment_ids``: ``[n]``, −1 for a token outside every segment (a passage's ``[CLS]`` and marker);
    ``segment_groups[s]``: segment s's group; ``token_groups``: ``[n]`` each token's group (a segment's
    tokens are in its group). The tokens outside segments form one more segment per group, so a group's
    max per query token is the max over its segments' maxima, and a max is exact: the group scores equal
    :func:`segment_maxsim` over the group's tokens bit for bit, for a scatter over segments instead of a
    second one over tokens. An empty group scores −inf.
    """
    segment_ids, token_groups = segment_ids.long(), token_groups.long()
    ids = torch.where(segment_ids >= 0, segment_ids, num_segments + token_groups)
    per_segment = segment_max(sim, ids, num_segments + num_groups)
    owners = torch.cat([segment_groups.long(), torch.arange(num_groups, device=segment_groups.device)])
    per_group = segment_max(per_segment, owners, num_groups)
    # contiguous: the sums then run over the same memory layout as segment_maxsim's (same bits)
    return (_query_sum(per_segment[:, :num_segments].contiguous().transpose(0, 1), query_mask),
            _query_sum(per_group.transpose(0, 1), query_mask))


def subquery_segment_maxsim(sim: torch.Tensor, query_masks: torch.Tensor, segment_ids: torch.Tensor,
                            num_segments: int) -> torch.Tensor:
    """Every sub-query against every segment (e.g. propositions × passages): ``[M, S]``.

    ``query_masks``: ``[M, Lq]``. Equals :func:`subquery_maxsim` on each segment's tokens;
    the per-token maxima are computed once for all sub-queries.
    """
    per_token = segment_max(sim, segment_ids, num_segments)  # [Lq, S]
    masks = query_masks.bool()
    # −inf maxima (empty segments) must not meet 0 weights in a matmul (0·−inf = NaN).
    finite = torch.isfinite(per_token).all(dim=0)
    scores = masks.to(sim.dtype) @ torch.where(torch.isfinite(per_token), per_token, torch.zeros_like(per_token))
    return scores.masked_fill(~finite.unsqueeze(0), NEG_INF)


def subquery_maxsim(
    sim: torch.Tensor,
    query_masks: torch.Tensor,
    doc_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of several sub-queries (subsets of query tokens) against one passage/span.

    ``sim``: ``[Lq, n]``; ``query_masks``: ``[M, Lq]``; ``doc_mask``: ``[n]``. Returns
    ``[M]``. The max over passage tokens is taken once and shared by all sub-queries.
    """
    if doc_mask is not None:
        sim = sim.masked_fill(~doc_mask.bool().unsqueeze(0), NEG_INF)
    per_token = sim.amax(dim=-1)
    return _query_sum(per_token.unsqueeze(0).expand(query_masks.shape[0], -1), query_masks)


def padded_maxsim(queries: torch.Tensor, query_mask: torch.Tensor, docs: torch.Tensor, doc_mask: torch.Tensor,
                  docs_per_chunk: int = 2048) -> torch.Tensor:
    """MaxSim of every query against every padded document: ``[B, Lq, d]`` queries (``query_mask``
    ``[B, Lq]``) × ``[n, W, d]`` documents (``doc_mask`` ``[n, W]``) → ``[B, n]``.

    One GEMM ``[B·Lq, d] × [c·W, d]ᵀ`` per chunk of ``c`` documents: a broadcast batched matmul of
    ``[B, 1, Lq, d]`` and ``[1, c, W, d]`` copies the documents once per query before multiplying
    (2.7× slower on the CPU; on a GPU the exact mining scan took 15 ms a question that way)."""
    b, lq, d = queries.shape
    n, w = doc_mask.shape
    flat = queries.reshape(b * lq, d)
    out = []
    for c in range(0, n, docs_per_chunk):
        k = min(docs_per_chunk, n - c)
        sim = similarity(flat, docs[c:c + k].reshape(k * w, d)).view(b, lq, k, w).permute(0, 2, 1, 3)
        out.append(maxsim(sim, doc_mask[c:c + k].unsqueeze(0), query_mask.unsqueeze(1)))
    return torch.cat(out, dim=1) if out else queries.new_zeros(b, 0)


def combined_score(span_scores: torch.Tensor, passage_scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """Score(q, s) = S'(q, s) + α·S(q, p) (AGRaME §3.2), broadcasting passage scores."""
    return span_scores + alpha * passage_scores
