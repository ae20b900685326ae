"""Sentence-aware token pooling: fewer vectors per passage, every sentence and span still scorable.

Hierarchical token pooling (Clavié, Chaffin, Adams 2024; sentence-transformers'
``HierarchicalTokenPooling``) clusters a document's token vectors with Ward's criterion and stores
each cluster's normalised mean. Unconstrained, a cluster may join tokens of two sentences — it then
belongs to neither, and a sentence may lose every vector. Here the clustering is *constrained*:

- only **adjacent** tokens of the **same sentence** may join (Ward with a chain connectivity cut at
  sentence borders), so every stored vector is one run of consecutive tokens inside one sentence and
  every sentence keeps at least one vector;
- tokens outside every sentence (``[CLS]``, the ``[D]`` marker, ``[SEP]``: character offsets with
  start == end) are protected, as the literature protects ``[CLS]``: each keeps its own vector.

A pooled vector then is a "wide token": its characters are ``(start of its first token, end of its
last)``, and :func:`agrame.spans.span_token_mask` — a token belongs to a span when its characters
overlap one of the span's pieces — applies unchanged. A span that cuts a cluster is scored by every
cluster it overlaps (so with the whole cluster's mean: a superset, never an empty span). The
runs are all an index keeps of the pooling (``pool.bin``, one byte per vector): with the tokenizer's
offsets they give the pooled offsets back exactly.

The count: a passage with ``n`` pooled-over tokens keeps ``max(sentences, ceil(n / factor))`` of
them (PyLate keeps ``n // factor`` over the whole document), merging the cheapest pair in the passage
first, so long sentences give up more vectors than short ones.
"""

from __future__ import annotations

import heapq
import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

#: A run is stored in one byte (``pool.bin``); a merge that would pass it is not made.
MAX_RUN = 255
#: The largest pool factor accepted (the literature stops at 4–6; past 16 a passage is a few vectors).
MAX_FACTOR = 16.0


def check_pool_factor(value) -> float:
    """A pool factor as a float in [1, :data:`MAX_FACTOR`]; ``ValueError`` naming the value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"pool factor must be a number from 1 to {MAX_FACTOR:g}, got {value!r}")
    try:
        factor = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"pool factor must be a number from 1 to {MAX_FACTOR:g}, got {value!r}") from None
    if not math.isfinite(factor) or not 1.0 <= factor <= MAX_FACTOR:
        raise ValueError(f"pool factor must be a number from 1 to {MAX_FACTOR:g}, got {value!r}")
    return int(factor) if factor == int(factor) else factor


def _ward(sa: np.ndarray, na: int, sb: np.ndarray, nb: int) -> float:
    # Ward's merge cost from cluster sums: na·nb/(na+nb) · ‖μa − μb‖² (the increase of the
    # within-cluster sum of squares; Lance–Williams' Ward update gives the same value).
    diff = sa / na - sb / nb
    return na * nb / (na + nb) * float(diff @ diff)


def pool_runs(vectors, segments, factor: float) -> np.ndarray:
    """Run lengths (token counts, in order, summing to ``len(vectors)``) of the pooled vectors of one
    passage: ``vectors`` ``[n, d]``; ``segments`` ``[n]`` each token's sentence (−1: protected).

    Greedy agglomeration, cheapest Ward merge of two adjacent runs of one sentence first (ties: the
    leftmost), until ``max(sentences, ceil(n_in_sentences / factor))`` runs of sentence tokens are left."""
    x = np.asarray(vectors, dtype=np.float64)
    seg = np.asarray(segments, dtype=np.int64).reshape(-1)
    n = len(seg)
    inside = seg >= 0
    n_in = int(inside.sum())
    target = max(len(np.unique(seg[inside])), math.ceil(n_in / factor)) if n_in else 0
    merges = n_in - target
    if merges <= 0:
        return np.ones(n, dtype=np.uint8)
    sums = [x[i] for i in range(n)]
    size = [1] * n
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n

    def joinable(a: int, b: int) -> bool:
        return 0 <= a and b < n and seg[a] >= 0 and seg[a] == seg[b] and size[a] + size[b] <= MAX_RUN

    first = 0.5 * ((x[1:] - x[:-1]) ** 2).sum(axis=1)  # _ward of two single tokens, all at once
    heap = [(float(first[i]), i, i + 1, 1, 1) for i in range(n - 1) if joinable(i, i + 1)]
    heapq.heapify(heap)
    while merges and heap:
        _, a, b, na, nb = heapq.heappop(heap)
        if not (alive[a] and alive[b] and nxt[a] == b and size[a] == na and size[b] == nb):
            continue  # stale: one side has merged since
        sums[a] = sums[a] + sums[b]
        size[a] += size[b]
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[a] < n:
            prv[nxt[a]] = a
        merges -= 1
        for left, right in ((prv[a], a), (a, nxt[a])):
            if joinable(left, right):
                heapq.heappush(heap, (_ward(sums[left], size[left], sums[right], size[right]),
                                      left, right, size[left], size[right]))
    return np.array([size[i] for i in range(n) if alive[i]], dtype=np.uint8)


def run_ids(runs) -> torch.Tensor:
    """The pooled vector of each original token: ``[sum(runs)]`` (0, 0, 1, 2, 2, …)."""
    runs = torch.as_tensor(np.asarray(runs, dtype=np.int64))
    return torch.repeat_interleave(torch.arange(len(runs)), runs)


def pool_by_runs(vectors: torch.Tensor, runs) -> torch.Tensor:
    """Each run's normalised mean ``[len(runs), d]``; differentiable in ``vectors`` and on their
    device (pooling-aware training backpropagates through it; the runs are chosen without gradient)."""
    ids = run_ids(runs).to(vectors.device)
    sums = torch.zeros((len(runs), vectors.shape[-1]), dtype=vectors.dtype, device=vectors.device)
    sums = sums.index_add(0, ids, vectors)
    return torch.nn.functional.normalize(sums, dim=-1)


def pooled_offsets(offsets, runs) -> torch.Tensor:
    """Characters of each pooled vector: from its first token's start to its last token's end."""
    offsets = torch.as_tensor(offsets, dtype=torch.long).reshape(-1, 2)
    runs = np.asarray(runs, dtype=np.int64)
    if int(runs.sum()) != offsets.shape[0]:
        raise ValueError(f"the runs cover {int(runs.sum())} tokens, the offsets {offsets.shape[0]}")
    ends = np.cumsum(runs)
    first, last = torch.from_numpy(ends - runs), torch.from_numpy(ends - 1)
    return torch.stack([offsets[first, 0], offsets[last, 1]], dim=1)


def pool_passage(vectors: torch.Tensor, offsets: torch.Tensor, sentences: Sequence[Tuple[int, int]],
                 factor: float) -> Tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Pool one encoded passage: ``(vectors [m, d], offsets [m, 2], runs [m] uint8)``. ``sentences``:
    its sorted, disjoint character spans (what the index stores)."""
    from .spans import token_segments

    segments = token_segments(offsets, list(sentences)) if len(sentences) else \
        torch.full((offsets.shape[0],), -1, dtype=torch.long)
    # zero-width tokens (specials) overlap no span already; keep them out explicitly all the same
    segments = torch.where(offsets[:, 1] > offsets[:, 0], segments, torch.full_like(segments, -1))
    runs = pool_runs(vectors.detach().float().cpu().numpy(), segments.numpy(), factor)
    if len(runs) == offsets.shape[0]:
        return vectors, offsets, runs
    return pool_by_runs(vectors.float(), runs).to(vectors.dtype), pooled_offsets(offsets, runs), runs


def pool_many(vectors: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor],
              sentences: Sequence[Sequence[Tuple[int, int]]], factor: float) -> List[tuple]:
    """:func:`pool_passage` of each passage."""
    return [pool_passage(v, o, s, factor) for v, o, s in zip(vectors, offsets, sentences)]


__all__ = ["MAX_FACTOR", "MAX_RUN", "check_pool_factor", "pool_by_runs", "pool_many", "pool_passage",
           "pool_runs", "pooled_offsets", "run_ids"]
