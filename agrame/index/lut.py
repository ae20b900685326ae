"""Scoring packed residual codes by lookup tables, without decompressing them (WARP, Scheerer et al.,
SIGIR 2025, §4; the ``xtr-warp`` engine).

A token is its centroid ``c`` plus a residual. For the scalar codec, dimension ``j`` is the bucket value ``w[b_j]``;
a byte of the packed residual holds ``8 / nbits`` consecutive dimensions. So for a query token ``q``

    q · (c + r) = q·c + Σ_g T[g, byte_g],    T[g, v] = Σ_{j in group g} q_j · w[b_j(v)]

— one table of 256 entries per byte position ``g`` (``d·nbits/8`` of them), built once per query
token, and a token's score is its centroid score plus one table entry per packed byte. A product codec's
residual is one codeword per sub-vector, so its tables are one per sub-vector, ``2^nbits`` entries each. These are
the scores of the *unnormalised* decompressed vector (:meth:`ResidualCodec.decompress` with
``normalize=False``); the exact stage renormalises, as ColBERTv2 does.

Candidate generation scores, for each query token, only the tokens of its ``nprobe`` nearest
centroids (:class:`TokenLists`: token rows grouped by centroid), then reduces in two stages: the
max per (passage, query token), then the sum over query tokens, a query token that met none of a
passage's tokens counting its *imputed* score — the score of its ``nprobe``-th centroid, which bounds
what an unprobed token would have scored through its centroid (WARP's missing-similarity estimate).

Pure functions over arrays; measured against the centroid-pruning stages of :mod:`.search` by
``python -m benchmarks.index_search stages``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch

from .codec import ResidualCodec
from .ivf import _ranges


def residual_tables(queries: torch.Tensor, codec: ResidualCodec) -> torch.Tensor:
    """``[L, d]`` query tokens → ``[L, G, V]`` tables (the codec's :meth:`~ResidualCodec.lookup_tables`): for
    the scalar codec ``G`` byte positions of ``V = 256`` byte values, for a product codec ``G = m``
    sub-vectors of ``V = 2^nbits`` codewords (the same sum: a product code's residual is its codewords)."""
    return codec.lookup_tables(queries)


def table_scores(tables: torch.Tensor, query_ids: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Residual part of the scores of ``n`` (query token, token) pairs: ``Σ_g T[query_ids, g, columns[:, g]]``.

    ``tables``: ``[L, G, V]`` (:func:`residual_tables`); ``query_ids``: ``[n]``; ``columns``: ``[n, G]``
    (the codec's :meth:`~ResidualCodec.lookup_codes` of the stored rows). Returns ``[n]`` float32."""
    length, groups, values = tables.shape
    columns = np.asarray(columns)
    if columns.ndim != 2 or columns.shape[1] != groups:
        raise ValueError(f"expected [n, {groups}] packed codes, got {list(columns.shape)}")
    flat = tables.reshape(-1).numpy()
    # int32 offsets (the tables hold L·G·V < 2³¹ entries): a 40% faster gather than int64's on 38k × 96
    # lookups, measured on one thread (a diagnostic run, not a committed benchmark).
    base = np.asarray(query_ids, dtype=np.int32)[:, None] * np.int32(groups * values) \
        + np.arange(groups, dtype=np.int32) * np.int32(values)
    return np.take(flat, base + columns).sum(axis=1, dtype=np.float32)


class TokenLists(NamedTuple):
    """Token rows grouped by centroid (CSR), and each row's passage: the token-level inverted file
    that WARP scans. Built in memory from the stored codes (an index does not store it): 8 bytes a token."""

    offsets: np.ndarray  # [K + 1] int64: the tokens of centroid c are rows[offsets[c]:offsets[c + 1]]
    rows: np.ndarray  # [T] int32 (int64 past 2³¹ tokens) token rows (positions in the codes/residuals files)
    owners: np.ndarray  # [T] int32 passage position of rows[k]

    @classmethod
    def build(cls, codes: np.ndarray, starts: np.ndarray, doclens: np.ndarray, num_centroids: int) -> "TokenLists":
        """From the codes of every stored token and each passage's first row and token count."""
        codes = np.asarray(codes)
        owner_of_row = np.full(len(codes), -1, dtype=np.int32)
        owner_of_row[_ranges(starts, doclens)] = np.repeat(np.arange(len(doclens), dtype=np.int32),
                                                           np.asarray(doclens, dtype=np.int64))
        order = np.argsort(codes, kind="stable")
        if len(codes) < 1 << 31:
            order = order.astype(np.int32)
        offsets = np.zeros(num_centroids + 1, dtype=np.int64)
        np.cumsum(np.bincount(codes, minlength=num_centroids), out=offsets[1:])
        return cls(offsets, order, owner_of_row[order])

    def probe(self, centroids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Positions (into :attr:`rows`) of the tokens of each centroid in ``centroids``, concatenated,
        and how many each centroid gave."""
        centroids = np.asarray(centroids, dtype=np.int64).ravel()
        counts = self.offsets[centroids + 1] - self.offsets[centroids]
        return _ranges(self.offsets[centroids], counts), counts


def reduce_two_stage(scores: np.ndarray, query_ids: np.ndarray, passages: np.ndarray, num_query: int,
                     imputed: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """WARP's reduction: max over each passage's scored tokens per query token, then the sum over
    query tokens, ``imputed[i]`` standing in for a query token that scored none of the passage's tokens.

    Returns the distinct passages (ascending) and their scores ``[P]`` float32."""
    unique, local = np.unique(np.asarray(passages), return_inverse=True)
    best = torch.full((len(unique) * num_query,), float("-inf"))
    best.scatter_reduce_(0, torch.from_numpy(local.astype(np.int64) * num_query + np.asarray(query_ids, dtype=np.int64)),
                         torch.from_numpy(np.asarray(scores, dtype=np.float32)), reduce="amax")
    best = best.reshape(len(unique), num_query)
    filled = torch.where(torch.isinf(best), torch.from_numpy(np.asarray(imputed, dtype=np.float32)), best)
    return unique, filled.sum(dim=1).numpy()


def warp_candidates(q: torch.Tensor, centroid_scores: torch.Tensor, codec: ResidualCodec, lists: TokenLists,
                    residuals: np.ndarray, nprobe: int, ncandidates: int,
                    allowed: Optional[np.ndarray] = None) -> np.ndarray:
    """The ``ncandidates`` passages with the best table-scored, two-stage-reduced scores (positions,
    best first). ``centroid_scores``: ``[L, K]`` q·c; ``residuals``: the stored packed residuals (rows
    are read from it); ``allowed``: a mask of passage positions (the others are never scored)."""
    length = q.shape[0]
    top = torch.topk(centroid_scores, min(nprobe, centroid_scores.shape[1]), dim=1)
    at, counts = lists.probe(top.indices.numpy())
    query_ids = np.repeat(np.repeat(np.arange(length), top.indices.shape[1]), counts)
    base = np.repeat(top.values.numpy().ravel(), counts)
    owners = lists.owners[at]
    rows = lists.rows[at]
    if allowed is not None:
        keep = allowed[owners]
        query_ids, base, owners, rows = query_ids[keep], base[keep], owners[keep], rows[keep]
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    scores = base + table_scores(residual_tables(q, codec), query_ids, codec.lookup_codes(residuals[rows]))
    unique, total = reduce_two_stage(scores, query_ids, owners, length, top.values[:, -1].numpy())
    keep_n = min(ncandidates, len(unique))
    best = np.argpartition(-total, keep_n - 1)[:keep_n] if keep_n < len(unique) else np.arange(len(unique))
    return unique[best[np.argsort(-total[best], kind="stable")]].astype(np.int64)
