"""Compiled loops (numba) for what numpy and torch can only do in several passes over memory.

The exact stage of a search decompresses each candidate token (centroid + residual, normalised) and takes,
per query token, its best dot product in each passage. Done as whole-array operations that is two gathers,
an add, a norm, a division and a matrix product, each writing or reading ``n × d`` floats: for the 300
candidates of a top 100 (≈ 48k tokens at d = 128) the token vectors go through memory five times, and
numpy's gathers hold the GIL, so two threads barely help. Here one passage's tokens are rebuilt into a
buffer that stays in the L1/L2 cache and scored at once (WARP's and PLAID's C++ stages do the same).

The math is :mod:`agrame.scoring`'s (:func:`agrame.scoring.compressed_run_max` is the entry point and
says what it computes); this module only holds the loops. Without numba (``AVAILABLE`` False) scoring
uses its array path.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a core dependency; a platform without a wheel falls back
    numba = None

AVAILABLE = numba is not None


def _group_row(groups, nbits, stride, t, g):
    """Token ``t``'s table row for group ``g``: ``groups[t, g]`` itself (``nbits`` 0), or the ``g``-th
    ``nbits``-bit code of the packed bytes ``groups[t]`` (one big-endian bit stream, the first code in the
    high bits: :func:`agrame.index.codec.pack_codes`) plus ``g · stride``."""
    if nbits == 0:
        return np.int64(groups[t, g])
    pos = g * nbits
    i = pos >> 3
    window = np.int64(groups[t, i]) << 8
    if i + 1 < groups.shape[1]:
        window |= np.int64(groups[t, i + 1])
    return ((window >> (16 - (pos & 7) - nbits)) & ((1 << nbits) - 1)) + g * stride


def _rebuild(centroids, codes, groups, nbits, stride, count, table, lo, hi, out):
    """Rows ``lo:hi`` of the tokens, decompressed and normalised into ``out[:hi - lo]``:
    ``centroids[codes[t]]`` plus, for each of the ``count`` groups ``g``, the ``table`` row of
    :func:`_group_row` added in dimensions ``g·w … g·w + w`` (``w`` the table's width; rows as wide as a
    token, an additive code's, are each added over all of it, in group order), divided by its norm (at
    least 1e-12). Packed codes are read where they lie, never unpacked into an array first."""
    d = centroids.shape[1]
    width = table.shape[1]
    for t in range(lo, hi):
        c = centroids[codes[t]]
        o = out[t - lo]
        if width == d:
            for j in range(d):
                o[j] = c[j]
            for g in range(count):
                row = table[_group_row_jit(groups, nbits, stride, t, g)]
                for j in range(d):
                    o[j] += row[j]
        elif nbits == 0:  # rows given (a scalar codec's bytes): the loop as it was, no per-group call
            for g in range(count):
                row = table[groups[t, g]]
                for j in range(width):
                    o[g * width + j] = c[g * width + j] + row[j]
        else:
            for g in range(count):
                row = table[_group_row_jit(groups, nbits, stride, t, g)]
                for j in range(width):
                    o[g * width + j] = c[g * width + j] + row[j]
        n2 = np.float32(0.0)
        for j in range(d):
            n2 += o[j] * o[j]
        norm = max(np.sqrt(n2), np.float32(1e-12))
        for j in range(d):
            o[j] /= norm


def _run_max(queries, centroids, codes, groups, nbits, stride, count, table, starts, out):
    """``out[i, r]``: the best dot product of query token ``i`` with the (decompressed, :func:`_rebuild`)
    tokens of run ``r`` (tokens ``starts[r] … starts[r + 1]``); −inf for an empty run."""
    lq, d = queries.shape
    longest = 0
    for r in range(starts.shape[0] - 1):
        longest = max(longest, starts[r + 1] - starts[r])
    buf = np.empty((max(longest, 1), d), dtype=np.float32)
    for r in range(starts.shape[0] - 1):
        lo, hi = starts[r], starts[r + 1]
        _rebuild_jit(centroids, codes, groups, nbits, stride, count, table, lo, hi, buf)
        for i in range(lq):
            q = queries[i]
            best = np.float32(-np.inf)
            for t in range(hi - lo):
                v = buf[t]
                s = np.float32(0.0)
                for j in range(d):
                    s += q[j] * v[j]
                if s > best:
                    best = s
            out[i, r] = best


def _table_maxsim(table, codes, lo, hi, out):
    """``out[r]``: Σ_i max over tokens ``t`` in ``lo[r] … hi[r]`` of ``table[codes[t], i]`` (−inf for an
    empty run) — a MaxSim whose similarities are looked up (a token's centroid's, for pruning by centroids)."""
    width = table.shape[1]
    best = np.empty(width, dtype=np.float32)
    for r in range(lo.shape[0]):
        best[:] = -np.inf
        for t in range(lo[r], hi[r]):
            row = table[codes[t]]
            for i in range(width):
                if row[i] > best[i]:
                    best[i] = row[i]
        total = np.float32(0.0)
        for i in range(width):
            total += best[i]
        out[r] = total


def _probed_maxsim(table, probe, offsets, pids, keep, slot_of, out_pids, out_scores):
    """Passages of the inverted lists ``probe`` (``pids[offsets[c]:offsets[c + 1]]`` for each ``c``; only
    those with ``keep[p]`` when ``keep`` is not empty), each once, into ``out_pids[:n]`` in the order first
    met, and ``out_scores[:n]``: Σ_i max over the lists ``a`` holding the passage of ``table[a, i]`` (row
    ``a`` the query's similarities to centroid ``probe[a]``) — a MaxSim over the probed centroids alone
    (PLAID's stage 2). ``slot_of`` (−1 for every passage) is scratch, left as it was found. Returns ``n``."""
    width = table.shape[1]
    n = 0
    for a in range(probe.shape[0]):
        c = probe[a]
        for e in range(offsets[c], offsets[c + 1]):
            p = pids[e]
            if keep.shape[0] and not keep[p]:
                continue
            if slot_of[p] < 0:
                slot_of[p] = n
                out_pids[n] = p
                n += 1
    best = np.full((max(n, 1), width), -np.inf, dtype=np.float32)
    for a in range(probe.shape[0]):
        c = probe[a]
        row = table[a]
        for e in range(offsets[c], offsets[c + 1]):
            p = pids[e]
            if keep.shape[0] and not keep[p]:
                continue
            b = best[slot_of[p]]
            for i in range(width):
                if row[i] > b[i]:
                    b[i] = row[i]
    for s in range(n):
        total = np.float32(0.0)
        for i in range(width):
            total += best[s, i]
        out_scores[s] = total
        slot_of[out_pids[s]] = -1
    return n


def _list_counts(codes, doclens, last, counts):
    """``counts[c]``: the passages holding a token of centroid ``c`` (passage ``p`` the ``doclens[p]`` tokens
    after ``p - 1``'s); ``last`` (−1 for every centroid) is scratch."""
    t = 0
    for p in range(doclens.shape[0]):
        for _ in range(doclens[p]):
            c = codes[t]
            if last[c] != p:
                last[c] = p
                counts[c] += 1
            t += 1


def _list_fill(codes, doclens, last, cursor, pids):
    """The inverted lists themselves: each passage into its centroids' lists once, at ``cursor[c]`` (the lists'
    starts, advanced), so each list is in passage order; ``last`` (−1 for every centroid) is scratch."""
    t = 0
    for p in range(doclens.shape[0]):
        for _ in range(doclens[p]):
            c = codes[t]
            if last[c] != p:
                last[c] = p
                pids[cursor[c]] = p
                cursor[c] += 1
            t += 1


if AVAILABLE:
    # fastmath: the dot products and norms may be summed in any order (vectorised), which moves a float32
    # score by a few ulps — inside the bound agrame.index.search.exact_margin allows for any float32 order.
    # nogil: the exact stage's chunk pool runs two chunks at once. cache: compiled once per install.
    _jit = numba.njit(nogil=True, fastmath=True, cache=True)
    _group_row_jit = _jit(_group_row)
    _rebuild_jit = _jit(_rebuild)
    run_max = _jit(_run_max)
    table_maxsim = _jit(_table_maxsim)
    probed_maxsim = _jit(_probed_maxsim)
    list_counts = _jit(_list_counts)
    list_fill = _jit(_list_fill)
else:  # pragma: no cover
    _group_row_jit, _rebuild_jit = _group_row, _rebuild
    run_max = table_maxsim = probed_maxsim = list_counts = list_fill = None
