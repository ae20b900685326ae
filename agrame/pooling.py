"""Sentence-aware token pooling: fewer vectors per passage, every sentence and span still scorable.

Hierarchical token pooling (Clavié, Chaffin, Adams 2024; sentence-transformers'
``HierarchicalTokenPooling``) clusters a document's token vectors with Ward's criterion and stores
each cluster's normalised mean. Unconstrained, a cluster may join tokens of two sentences — it then
belongs to neither, and a sentence may lose every vector. Here the clustering is *constrained*:

- only tokens of the **same sentence** may join (Ward with a connectivity cut at sentence borders),
  so every stored vector belongs to exactly one sentence and every sentence keeps at least one vector;
  inside a sentence any tokens may join (a repeated word, a name's pieces), which measured better
  than joining neighbours only (``python -m benchmarks.pool_methods``, SQuAD train);
- tokens outside every sentence (``[CLS]``, the ``[D]`` marker, ``[SEP]``: character offsets with
  start == end) are protected, as the literature protects ``[CLS]``: each keeps its own vector.

The count: a passage with ``n`` pooled-over tokens keeps ``max(sentences, ceil(n / factor))`` of
them (PyLate keeps ``n // factor`` over the whole document), merging the cheapest pair in the passage
first, so long sentences give up more vectors than short ones.

Vectors are ordered by their first token; a vector's characters are from its first token's start to
its last token's end (:func:`pooled_offsets`): what sentences are told by (a vector lies in its
sentence). A span is scored by every pooled vector one of whose *tokens* overlaps it
(:func:`member_span_mask`: the token rule of :func:`agrame.spans.span_token_mask`, then any over a
vector's tokens), so a span that cuts a cluster is scored with the whole cluster's mean. An index keeps
which vector each original token went to in one byte a token (:func:`encode_assignment`), so that the
tokenizer's offsets give the pooled offsets and the members back exactly.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

#: Tokens of one sentence are clustered in blocks of at most this many consecutive tokens, so that the
#: one-byte code of a token (how many vectors back its own started) never passes 255.
MAX_BLOCK = 255
#: The largest pool factor accepted (the literature stops at 4–6; past 16 a passage is a few vectors).
MAX_FACTOR = 16.0


def check_pool_factor(value) -> float:
    """A pool factor as a number in [1, :data:`MAX_FACTOR`] (an int when whole); ``ValueError`` naming
    the value otherwise."""
    try:
        factor = float("nan") if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        factor = float("nan")
    if not math.isfinite(factor) or not 1.0 <= factor <= MAX_FACTOR:
        raise ValueError(f"pool factor must be a number from 1 to {MAX_FACTOR:g}, got {value!r}")
    return int(factor) if factor == int(factor) else factor


def ward_cost(sa: np.ndarray, na: int, sb: np.ndarray, nb: int) -> float:
    """Ward's merge cost of two clusters from their sums and sizes: na·nb/(na+nb) · ‖μa − μb‖² (the rise
    of the within-cluster sum of squares; Lance–Williams' Ward update gives the same value)."""
    diff = sa / na - sb / nb
    return na * nb / (na + nb) * float(diff @ diff)


def blocks(segments) -> np.ndarray:
    """The connectivity: tokens with the same block id may join; −1: protected (alone). A block is one
    sentence's tokens, cut every :data:`MAX_BLOCK` tokens."""
    seg = np.asarray(segments, dtype=np.int64).reshape(-1)
    out = np.full(len(seg), -1, dtype=np.int64)
    inside = np.flatnonzero(seg >= 0)
    if len(inside):
        s = seg[inside]
        first = np.concatenate([[True], s[1:] != s[:-1]])  # a sentence's tokens are consecutive rows
        start = np.maximum.accumulate(np.where(first, np.arange(len(s)), 0))
        out[inside] = s * (1 << 20) + (np.arange(len(s)) - start) // MAX_BLOCK
    return out


def _pair_costs(x: np.ndarray) -> np.ndarray:
    """Ward costs of every pair of single tokens, ``[s, s]``, symmetric, +inf on the diagonal."""
    s = len(x)
    if s * s * x.shape[1] <= 1 << 22:
        cost = 0.5 * ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)
    else:  # a long sentence: the Gram form, without an [s, s, d] temporary
        sq = (x * x).sum(axis=1)
        cost = 0.5 * np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0)
    np.fill_diagonal(cost, np.inf)
    return cost


class _Block:
    """One block's clusters: sums, sizes, means and the Ward cost of every pair of live clusters
    (symmetric; +inf for a dead cluster and on the diagonal)."""

    def __init__(self, members: np.ndarray, x: np.ndarray):
        self.members = members  # token index of each local cluster's first token (its id)
        self.sums = x[members].copy()
        self.means = self.sums.copy()
        self.size = np.ones(len(members), dtype=np.float64)
        self.cost = _pair_costs(self.sums)
        self.version = 0

    def best(self):
        # Row-major over a symmetric matrix: of equal costs, the pair with the smallest first cluster,
        # then the smallest second, wins — the (a, b) order of the ids, which follow the tokens.
        k = int(np.argmin(self.cost))
        i, j = divmod(k, len(self.members))
        return float(self.cost[i, j]), min(i, j), max(i, j)

    def merge(self, i: int, j: int) -> None:
        self.sums[i] += self.sums[j]
        self.size[i] += self.size[j]
        self.size[j] = 0.0
        self.means[i] = self.sums[i] / self.size[i]
        diff = self.means - self.means[i]
        costs = self.size[i] * self.size / (self.size[i] + self.size) * np.einsum("ij,ij->i", diff, diff)
        costs[self.size == 0] = np.inf
        costs[i] = np.inf
        self.cost[i, :] = costs
        self.cost[:, i] = costs
        self.cost[j, :] = np.inf
        self.cost[:, j] = np.inf
        self.version += 1


def pool_assignment(vectors, segments, factor: float) -> np.ndarray:
    """The pooled vector of each token of one passage (``[n]``, vectors numbered by first token):
    ``vectors`` ``[n, d]``; ``segments`` ``[n]`` each token's sentence (−1: protected).

    Greedy agglomeration, cheapest Ward merge of two clusters of one block first (ties: the smallest
    first tokens), until ``max(sentences, ceil(n_in_sentences / factor))`` clusters of sentence
    tokens are left (or no two clusters of a block are left to merge)."""
    x = np.asarray(vectors, dtype=np.float64)
    seg = np.asarray(segments, dtype=np.int64).reshape(-1)
    n = len(seg)
    inside = seg >= 0
    n_in = int(inside.sum())
    target = max(len(np.unique(seg[inside])), math.ceil(n_in / factor)) if n_in else 0
    merges = n_in - target
    parent = np.arange(n, dtype=np.int64)
    if merges <= 0:
        return parent
    block = blocks(seg)
    groups = []
    for key in np.unique(block[block >= 0]):
        members = np.flatnonzero(block == key)
        if len(members) > 1:
            groups.append(_Block(members, x))
    heap = []
    for g, group in enumerate(groups):
        cost, i, j = group.best()
        heap.append((cost, int(group.members[i]), int(group.members[j]), g, group.version, i, j))
    heapq.heapify(heap)
    while merges and heap:
        cost, a, b, g, version, i, j = heapq.heappop(heap)
        group = groups[g]
        if version != group.version:
            continue  # stale: this block has merged since
        if not math.isfinite(cost):
            continue  # nothing left to merge in this block
        group.merge(i, j)
        parent[b] = a
        merges -= 1
        cost, i, j = group.best()
        if math.isfinite(cost):
            heapq.heappush(heap, (cost, int(group.members[i]), int(group.members[j]), g, group.version, i, j))
    root = parent
    while True:  # (a cluster's id is its first token: parents point backwards, so this ends)
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    _, assignment = np.unique(root, return_inverse=True)  # numbered in first-token order
    return assignment.astype(np.int64)


def token_assignment(vectors, offsets, segments, factor: float) -> np.ndarray:
    """:func:`pool_assignment` of one passage's tokens (``offsets`` ``[n, 2]``, ``segments`` ``[n]``) with its
    zero-width tokens (``[CLS]``, ``[D]``, ``[SEP]``) protected whatever sentence they were given."""
    offsets, segments = torch.as_tensor(offsets), torch.as_tensor(segments)
    segments = torch.where(offsets[:, 1] > offsets[:, 0], segments, torch.full_like(segments, -1))
    x = vectors.detach().float().cpu().numpy() if torch.is_tensor(vectors) else np.asarray(vectors, dtype=np.float32)
    return pool_assignment(x, segments.numpy(), factor)


def pool_by_assignment(vectors: torch.Tensor, assignment) -> torch.Tensor:
    """Each pooled vector's normalised mean ``[m, d]``; differentiable in ``vectors`` and on their device
    (pooling-aware training backpropagates through it; the assignment is chosen without gradient)."""
    assignment = np.asarray(assignment, dtype=np.int64)
    m = int(assignment.max(initial=-1)) + 1  # on the host: no device sync
    ids = torch.from_numpy(assignment).to(vectors.device)
    sums = torch.zeros((m, vectors.shape[-1]), dtype=vectors.dtype, device=vectors.device)
    sums = sums.index_add(0, ids, vectors)
    return torch.nn.functional.normalize(sums, dim=-1)


def pooled_offsets(offsets, assignment) -> torch.Tensor:
    """Characters of each pooled vector: from its first token's start to its last token's end."""
    offsets = torch.as_tensor(offsets, dtype=torch.long).reshape(-1, 2)
    ids = torch.as_tensor(np.asarray(assignment, dtype=np.int64))
    if ids.shape[0] != offsets.shape[0]:
        raise ValueError(f"the assignment covers {ids.shape[0]} tokens, the offsets {offsets.shape[0]}")
    m = int(ids.max()) + 1 if len(ids) else 0
    start = torch.full((m,), torch.iinfo(torch.long).max, dtype=torch.long).scatter_reduce(
        0, ids, offsets[:, 0], reduce="amin")
    end = torch.zeros(m, dtype=torch.long).scatter_reduce(0, ids, offsets[:, 1], reduce="amax")
    return torch.stack([start, end], dim=1)


def member_span_mask(member_offsets, assignment, spans) -> torch.Tensor:
    """``[len(spans), m]``: pooled vector v belongs to span i when one of *its tokens* overlaps the span
    (:func:`agrame.spans.span_token_mask` over the original tokens, then any over each vector's tokens) —
    exact where a vector's characters (first to last token) would also hold tokens of other vectors."""
    from .spans import span_token_mask

    assignment = np.asarray(assignment, dtype=np.int64)
    m = int(assignment.max(initial=-1)) + 1
    tokens = span_token_mask(member_offsets, spans).to(torch.float32)
    out = torch.zeros((tokens.shape[0], m), dtype=torch.float32).index_add(1, torch.from_numpy(assignment), tokens)
    return out > 0


def encode_assignment(assignment) -> np.ndarray:
    """One byte a token: 0 where the token starts a new vector, else 1 + how many vectors back from the
    newest started so far its own vector is (1: the newest). Bounded by 255 (:data:`MAX_BLOCK`)."""
    a = np.asarray(assignment, dtype=np.int64)
    started = np.maximum.accumulate(a) if len(a) else a
    new = np.concatenate([[True], a[1:] > started[:-1]]) if len(a) else a.astype(bool)
    codes = np.where(new, 0, started - a + 1)
    if len(codes) and codes.max() > 255:
        raise ValueError("a token's vector is more than 255 vectors back")
    return codes.astype(np.uint8)


def decode_assignment(codes) -> np.ndarray:
    """:func:`encode_assignment` undone: the vector of each token."""
    c = np.asarray(codes, dtype=np.int64)
    newest = np.cumsum(c == 0) - 1  # the newest vector started at or before each token
    return np.where(c == 0, newest, newest - c + 1)


def pool_passage(vectors: torch.Tensor, offsets: torch.Tensor, sentences: Sequence[Tuple[int, int]],
                 factor: float) -> Tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Pool one encoded passage: ``(vectors [m, d], offsets [m, 2], codes [n] uint8)``. ``sentences``:
    its sorted, disjoint character spans (what the index stores)."""
    from .spans import token_segments

    segments = token_segments(offsets, list(sentences)) if len(sentences) else \
        torch.full((offsets.shape[0],), -1, dtype=torch.long)
    assignment = token_assignment(vectors, offsets, segments, factor)
    codes = encode_assignment(assignment)
    if int(assignment.max(initial=-1)) + 1 == offsets.shape[0]:
        return vectors, offsets, codes
    return (pool_by_assignment(vectors.float(), assignment).to(vectors.dtype), pooled_offsets(offsets, assignment),
            codes)


# -- a batch of passages at once, on any device (pooling-aware training on a GPU, issue 61) ------------------
#
# The host clustering above takes ~1.8 ms a passage on one core: 512 passages a training step on a GPU made a
# ~4 s step. Below, the same greedy Ward agglomeration runs for a whole batch as tensor operations: each
# passage's cost matrix of token pairs (+inf across blocks), one argmin a round for every passage at once. The
# host knows each passage's blocks and merges from its sentences alone (:class:`BatchPlan`), so the device loop
# runs a fixed number of rounds and never waits for a value to come back. Row-major argmin over a symmetric
# matrix returns the pair with the smallest (first token, second token) among equal costs: the host heap's
# tie-break, so the assignments are the host's (float64 throughout, as there; only costs equal to the last bit
# under another summation order could be told apart otherwise).

#: The host computes a block's first costs directly while ``s·s·d`` stays within this (``_pair_costs``).
_DIRECT_LIMIT = 1 << 22


class BatchPlan:
    """The host's side of a batch's clustering, known before any vector is read: each passage's blocks
    (``[N, W]``, −1 protected or past its end), merges and vector count, the rounds of the device loop,
    which tokens' blocks take the Gram form of the first costs, and the band the direct form covers.
    ``segments[b]``: passage b's tokens' sentences (−1: protected), ``dim``: the vectors' size."""

    def __init__(self, segments: Sequence, factor: float, dim: int):
        segments = [np.asarray(s, dtype=np.int64).reshape(-1) for s in segments]
        self.lengths = [len(s) for s in segments]
        self.width = max(self.lengths, default=0) or 1
        self.blocks = np.full((len(segments), self.width), -1, dtype=np.int64)
        self.gram = np.zeros((len(segments), self.width), dtype=bool)
        self.merges, self.counts, self.band = [], [], 1
        for b, seg in enumerate(segments):
            block = blocks(seg)
            self.blocks[b, :len(seg)] = block
            inside = seg >= 0
            n_in = int(inside.sum())
            target = max(len(np.unique(seg[inside])), math.ceil(n_in / factor)) if n_in else 0
            keys, inverse, sizes = np.unique(block[block >= 0], return_inverse=True, return_counts=True)
            # the host stops at its target, or when every block is down to one cluster (its heap runs dry)
            merges = max(0, min(n_in - target, int((sizes - 1).sum())))
            self.merges.append(merges)
            self.counts.append(len(seg) - merges)
            big = sizes * sizes * dim > _DIRECT_LIMIT
            self.gram[b, :len(seg)][block >= 0] = big[inverse]
            if (~big).any():
                self.band = max(self.band, int(sizes[~big].max()))
        self.rounds = max(self.merges, default=0)


def _rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[b, idx[b]]`` for each b (``t`` ``[N, W, …]``): a gather, no host round trip."""
    shape = (t.shape[0], 1, *t.shape[2:])
    return t.gather(1, idx.view(-1, 1, *([1] * (t.dim() - 2))).expand(shape)).squeeze(1)


def _set_rows(t: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> None:
    shape = (t.shape[0], 1, *t.shape[2:])
    t.scatter_(1, idx.view(-1, 1, *([1] * (t.dim() - 2))).expand(shape), values.unsqueeze(1))


def batch_pool_assignment(vectors: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """:func:`pool_assignment` of every passage of a batch at once on ``vectors``' device: ``vectors``
    ``[N, ≥W, d]`` (passage b's tokens at ``[b, :plan.lengths[b]]``) → ``[N, W]`` int64, each token's pooled
    vector (numbered by first token), −1 past a passage's end. Without gradient; no value is read back."""
    dev, n, w = vectors.device, len(plan.lengths), plan.width
    inf = float("inf")
    cols = torch.arange(w, device=dev)
    valid = cols.unsqueeze(0) < torch.tensor(plan.lengths, device=dev).unsqueeze(1)
    x = vectors[:, :w].detach().to(torch.float64) * valid.unsqueeze(-1)
    blk = torch.from_numpy(plan.blocks).to(dev)
    same = (blk.unsqueeze(2) == blk.unsqueeze(1)) & (blk >= 0).unsqueeze(2) & (cols.unsqueeze(1) != cols)
    cost = torch.full((n, w, w), inf, dtype=torch.float64, device=dev)
    for k in range(1, min(plan.band, w)):  # a block's tokens are consecutive: its pairs lie < band apart
        d = x[:, k:] - x[:, :-k]
        band = 0.5 * (d * d).sum(dim=-1)
        cost.diagonal(offset=k, dim1=1, dim2=2).copy_(band)
        cost.diagonal(offset=-k, dim1=1, dim2=2).copy_(band)
    if plan.gram.any():  # a long sentence: the host's Gram form of the same costs
        sq = (x * x).sum(dim=-1)
        g = 0.5 * torch.clamp(sq.unsqueeze(2) + sq.unsqueeze(1) - 2 * (x @ x.transpose(1, 2)), min=0.0)
        gram = torch.from_numpy(plan.gram).to(dev)
        cost = torch.where(gram.unsqueeze(2) & gram.unsqueeze(1), g, cost)
    cost = cost.masked_fill(~same, inf)
    sums, means, size = x.clone(), x.clone(), valid.to(torch.float64)
    parent = cols.unsqueeze(0).expand(n, w).clone()
    remaining = torch.tensor(plan.merges, device=dev)
    for _ in range(plan.rounds):
        flat = cost.view(n, w * w)
        k = flat.argmin(dim=1)  # the first of equal minima (row-major): the smallest (first, second) token
        best = flat.gather(1, k.unsqueeze(1)).squeeze(1)
        active = (remaining > 0) & torch.isfinite(best)  # (an inactive passage's writes put back what was there)
        remaining = remaining - active.long()
        i, j = k // w, k % w
        on = active.unsqueeze(1)
        si, zi, zj = _rows(sums, i), _rows(size, i), _rows(size, j)
        si = torch.where(on, si + _rows(sums, j), si)
        zi = torch.where(active, zi + zj, zi)
        _set_rows(sums, i, si)
        _set_rows(size, i, zi)
        _set_rows(size, j, torch.where(active, torch.zeros_like(zj), zj))
        mean_i = torch.where(on, si / zi.unsqueeze(1), _rows(means, i))
        _set_rows(means, i, mean_i)
        diff = means - mean_i.unsqueeze(1)
        row = zi.unsqueeze(1) * size / (zi.unsqueeze(1) + size) * (diff * diff).sum(dim=-1)
        row = row.masked_fill((size == 0) | (blk != _rows(blk, i).unsqueeze(1)) | (cols == i.unsqueeze(1)), inf)
        row = torch.where(on, row, _rows(cost, i))
        _set_rows(cost, i, row)
        cost.scatter_(2, i.view(n, 1, 1).expand(n, w, 1), row.unsqueeze(2))
        dead = torch.where(on, torch.full_like(row, inf), _rows(cost, j))
        _set_rows(cost, j, dead)
        cost.scatter_(2, j.view(n, 1, 1).expand(n, w, 1), dead.unsqueeze(2))
        _set_rows(parent, j, torch.where(active, i, _rows(parent, j)))
    for _ in range(max(1, math.ceil(math.log2(w)) + 1)):  # parents point backwards: pointer doubling ends it
        parent = parent.gather(1, parent)
    roots = (parent == cols) & valid
    rank = roots.long().cumsum(dim=1) - 1
    return rank.gather(1, parent).masked_fill(~valid, -1)


def batch_pool(vectors: torch.Tensor, assignment: torch.Tensor, counts: Sequence[int],
               segments: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Each passage's pooled vectors (:func:`pool_by_assignment` for a batch): ``vectors`` ``[N, ≥W, d]``
    (differentiable), ``assignment`` ``[N, W]`` (−1: none) → ``[N, max(counts), d]``, zeros past a passage's
    count; with ``segments`` ``[N, W]``, each pooled vector's sentence (its first token's; −1 past the end)."""
    n, w = assignment.shape
    m = max(counts, default=0) or 1
    dev = vectors.device
    offset = (torch.arange(n, device=dev) * m).unsqueeze(1)
    ids = torch.where(assignment >= 0, assignment + offset, torch.full_like(assignment, n * m)).reshape(-1)
    x = vectors[:, :w]
    sums = torch.zeros((n * m + 1, x.shape[-1]), dtype=x.dtype, device=dev).index_add(0, ids, x.reshape(-1, x.shape[-1]))
    pooled = torch.nn.functional.normalize(sums[:-1].view(n, m, -1), dim=-1)
    if segments is None:
        return pooled, None
    first = torch.cat([torch.ones_like(assignment[:, :1], dtype=torch.bool), assignment[:, 1:] > assignment[:, :-1]
                       .cummax(dim=1).values], dim=1) & (assignment >= 0)  # a token that starts a vector
    slots = torch.where(first, assignment + offset, torch.full_like(assignment, n * m)).reshape(-1)
    seg = torch.full((n * m + 1,), -1, dtype=torch.long, device=dev).scatter(0, slots, segments[:, :w].reshape(-1))
    return pooled, seg[:-1].view(n, m)


__all__ = ["MAX_BLOCK", "MAX_FACTOR", "BatchPlan", "batch_pool", "batch_pool_assignment", "blocks", "check_pool_factor",
           "decode_assignment", "encode_assignment",
           "member_span_mask", "pool_assignment", "pool_by_assignment", "pool_passage", "pooled_offsets",
           "token_assignment", "ward_cost"]
