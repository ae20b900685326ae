"""Inverted file: centroid → the passages holding a token assigned to it (CSR arrays).

A passage appears once per centroid however many of its tokens share it, so the lists
hold (centroid, passage) pairs, about 0.6–0.7 per token on Wikipedia passages.

On disk the passages of a list can be stored as int32 (``"ivf_pids": "int32"``, every index written
before 2026-11-29) or, as Lucene stores its postings, as the gaps between consecutive passages in
variable-length bytes (``"varint"``: 7 bits a byte, the high bit set on every byte but a value's
last). A list's first gap is its first passage. The gaps in a list of a 16k-centroid index average
~170 passages, so most take one or two bytes: 2.9 → 0.93 bytes per token on the 33,591-passage pool
(issue 64's ≤ 20 B/token). The lists are decoded once when an index opens (~30 ms for 2.9 M pairs).

Since 2026-12-01 a new index stores no inverted file at all (``"derived"``): the lists are a function of
the centroid ids already in ``codes.bin`` and the passages' token counts, so :func:`derive_ivf` rebuilds them
when the index opens, in two passes over the codes (one to count each list, one to fill it), every list in
passage order. That saves the 0.97 bytes a token the lists and their offsets took on the pool, and the lists
can never disagree with the codes they index.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..scoring import ranges


_ranges = ranges  # (its callers in the index package import it from here)


class InvertedFile(NamedTuple):
    offsets: np.ndarray  # [K + 1] int64: list c is pids[offsets[c]:offsets[c + 1]]
    pids: np.ndarray  # [pairs] int32, ascending within each list

    def pairs(self) -> np.ndarray:
        """All (centroid, passage) pairs as ``centroid << 32 | passage`` (int64), sorted."""
        counts = np.diff(self.offsets)
        cent = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return (cent << 32) | np.asarray(self.pids, dtype=np.int64)


def encode_varint(ivf: InvertedFile) -> bytes:
    """The lists' passages as varint gaps (a list's first value its first passage), list after list."""
    pids = np.asarray(ivf.pids, dtype=np.int64)
    if not len(pids):
        return b""
    gaps = pids.copy()
    gaps[1:] -= pids[:-1]
    starts = ivf.offsets[:-1][np.diff(ivf.offsets) > 0]
    gaps[starts] = pids[starts]
    if gaps.min() < 0 or gaps.max() >= 1 << 35:
        raise ValueError("inverted file lists must hold ascending passages below 2^35")
    nbytes = 1 + sum((gaps >= 1 << (7 * j)).astype(np.int64) for j in range(1, 5))
    owner = np.repeat(np.arange(len(gaps)), nbytes)
    shift = np.arange(len(owner)) - np.repeat(np.cumsum(nbytes) - nbytes, nbytes)
    out = (gaps[owner] >> (7 * shift)) & 0x7F
    out[shift < nbytes[owner] - 1] |= 0x80
    return out.astype(np.uint8).tobytes()


def decode_varint(data: np.ndarray, offsets: np.ndarray, num_passages: int) -> np.ndarray:
    """What :func:`encode_varint` wrote, back as the lists' int32 passages; a stream that does not hold
    exactly ``offsets[-1]`` ascending passages below ``num_passages`` raises ``ValueError``."""
    data = np.asarray(data, dtype=np.uint8)
    total = int(offsets[-1])
    last = data < 0x80  # a value's last byte
    if int(last.sum()) != total or (len(data) and not last[-1]):
        raise ValueError(f"the inverted file's passage stream holds {int(last.sum())} whole values, not {total}")
    if not total:
        return np.zeros(0, dtype=np.int32)
    begin = np.flatnonzero(np.concatenate([[True], last[:-1]]))
    length = np.diff(np.append(begin, len(data)))
    if length.max() > 5:
        raise ValueError("the inverted file's passage stream holds a value of over 5 bytes")
    values = (data[begin] & 0x7F).astype(np.int64)
    for j in range(1, int(length.max())):
        more = length > j
        values[more] |= (data[begin[more] + j] & 0x7F).astype(np.int64) << (7 * j)
    counts = np.diff(offsets)
    first = offsets[:-1][counts > 0]
    inner = np.ones(total, dtype=bool)
    inner[first] = False
    if (values[inner] <= 0).any():
        raise ValueError("the inverted file's lists are not ascending")
    pids = np.cumsum(values)
    pids -= np.repeat(pids[first] - values[first], counts[counts > 0])
    if pids.max() >= num_passages:
        raise ValueError(f"the inverted file names passage {int(pids.max())} of {num_passages}")
    return pids.astype(np.int32)


def unique_pairs(codes: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """Distinct (centroid, passage) pairs of a run of tokens, packed as ``centroid << 32 | passage``."""
    return np.unique((np.asarray(codes, dtype=np.int64) << 32) | np.asarray(pids, dtype=np.int64))


def build_ivf(pairs: np.ndarray, num_centroids: int) -> InvertedFile:
    """CSR lists from packed pairs (any order; duplicates removed)."""
    pairs = np.unique(pairs)
    cent = pairs >> 32
    offsets = np.zeros(num_centroids + 1, dtype=np.int64)
    np.cumsum(np.bincount(cent, minlength=num_centroids), out=offsets[1:])
    return InvertedFile(offsets, (pairs & 0xFFFFFFFF).astype(np.int32))


def derive_ivf(codes: np.ndarray, doclens: np.ndarray, num_centroids: int) -> InvertedFile:
    """The lists of the tokens ``codes`` (passage ``p`` holding the ``doclens[p]`` tokens after passage
    ``p - 1``'s): what :func:`build_ivf` gives for their distinct (centroid, passage) pairs. A code of
    ``num_centroids`` or more raises ``ValueError``."""
    from .. import kernels

    codes = np.asarray(codes)
    doclens = np.ascontiguousarray(doclens, dtype=np.int64)
    if len(codes) != int(doclens.sum()):
        raise ValueError(f"the passages hold {int(doclens.sum())} tokens, codes.bin {len(codes)}")
    if len(codes) and int(codes.max()) >= num_centroids:
        raise ValueError(f"codes.bin names centroid {int(codes.max())} of {num_centroids}")
    if not kernels.AVAILABLE:  # pragma: no cover
        owners = np.repeat(np.arange(len(doclens), dtype=np.int64), doclens)
        return build_ivf(unique_pairs(codes, owners), num_centroids)
    offsets = np.zeros(num_centroids + 1, dtype=np.int64)
    last = np.full(num_centroids, -1, dtype=np.int64)
    kernels.list_counts(codes, doclens, last, offsets[1:])
    np.cumsum(offsets, out=offsets)
    pids = np.empty(int(offsets[-1]), dtype=np.int32)
    last[:] = -1
    kernels.list_fill(codes, doclens, last, offsets[:-1].copy(), pids)
    return InvertedFile(offsets, pids)


def merge_ivf(ivf: InvertedFile, new_pairs: np.ndarray, num_centroids: int) -> InvertedFile:
    """The lists of ``ivf`` plus new pairs: what :func:`build_ivf` gives for all pairs at once."""
    return build_ivf(np.concatenate([ivf.pairs(), new_pairs]), num_centroids)
