"""Residual codecs: a token is its nearest centroid plus a coded residual.

:class:`ResidualCodec` (ColBERTv2 §3) quantises the residual to ``nbits`` per dimension;
:class:`ProductCodec` codes it by product quantization (Jégou et al., 2011): ``m`` sub-vectors of
``d/m`` dimensions, each the nearest of ``2^nbits`` codewords (``"pq16x6"``: 12 bytes a token at
d = 128, where 2 bits a dimension take 32), optionally after a learned rotation of the residuals
(optimized PQ, Ge et al., 2013: ``"opq16x7"``, faiss's ``OPQMatrix``); :class:`AdditiveCodec` by residual
quantization (Chen et al., 2010): ``m`` codebooks of whole ``d``-dimensional codewords, the residual the
sum of one codeword from each, chosen stage by stage with a beam (``"rq14x8"``: 14 bytes a token, any
``m``, not only a divisor of ``d``). All expose the same interface — ``compress``,
``decompress``, ``assign``, and the lookup tables of :mod:`.lut` — so the store, writer and search
never ask which one they hold.

For :class:`ResidualCodec`:

Bucket cut-offs are the quantiles ``1/B … (B-1)/B`` of all residual values (B = 2^nbits,
one set shared by every dimension) and each bucket is reconstructed as the quantile at
its middle, so a value is off by at most its bucket's width (the outer buckets reach to
the extremes of the training residuals). Decompressed vectors are renormalised, as
ColBERTv2 does: scores stay cosine similarities.

Pure functions over numpy arrays; the index files store exactly what they return.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from .. import scoring

NBITS = (1, 2, 4, 8)
#: Bits of one product-quantizer code (codes are packed; 6 bits: four codes in three bytes, 7: eight in seven).
PQ_NBITS = (4, 6, 7, 8)
#: Residuals a product quantizer is trained on, at most (2¹⁸: the sample ``benchmarks.residual_codecs`` chose
#: the format with). A build's k-means sample alone leaves it a few thousand held-out ones (5% of 8 a centroid).
PQ_TRAIN_POINTS = 1 << 18


def parse_residuals(spec) -> Tuple[str, int, int]:
    """A residual codec as users name it → ``(kind, nbits, m)``: an int (or ``"2"``, ``"2bit"``) is the
    scalar codec at that many bits a dimension (m = 0); ``"pqMxB"`` is ``M`` sub-vectors of ``B`` bits,
    ``"opqMxB"`` the same after a learned rotation, ``"rqMxB"`` ``M`` additive codebooks of ``B`` bits."""
    text = str(spec).strip().lower()
    for kind in ("opq", "pq", "rq"):
        if text.startswith(kind):
            parts = text[len(kind):].split("x")
            if len(parts) == 2 and all(p.isdigit() for p in parts) and int(parts[1]) in PQ_NBITS \
                    and int(parts[0]) > 0 and int(parts[0]) % codes_per_group(int(parts[1])) == 0:
                return kind, int(parts[1]), int(parts[0])
            raise ValueError(f"residual codec {spec!r}: write {kind}MxB with B in {PQ_NBITS} and M a multiple of "
                             "the codes that fill whole bytes (2 at 4 bits, 4 at 6, 8 at 7; e.g. pq16x6, rq14x8)")
    text = text[:-3] if text.endswith("bit") else text
    if text.isdigit() and int(text) in NBITS:
        return "scalar", int(text), 0
    raise ValueError(f"residual codec {spec!r}: bits a dimension must be one of {NBITS}, or pqMxB, opqMxB, rqMxB "
                     "(e.g. pq16x6, rq14x8)")


def residuals_option(spec):
    """A residual codec as build options take it: an int (bits a dimension) or ``"pqMxB"``."""
    kind, nbits, m = parse_residuals(spec)
    return nbits if kind == "scalar" else f"{kind}{m}x{nbits}"


def residuals_name(spec) -> str:
    """The canonical name of a residual codec: ``"2bit"``, ``"pq16x6"``."""
    kind, nbits, m = parse_residuals(spec)
    return f"{nbits}bit" if kind == "scalar" else f"{kind}{m}x{nbits}"


def num_centroids(num_tokens: int) -> int:
    """ColBERTv2's rule: the power of two at or below 16·√T (at least 1)."""
    return int(2 ** np.floor(np.log2(max(1.0, 16 * np.sqrt(max(1, num_tokens))))))


def pack_bits(buckets: np.ndarray, nbits: int) -> np.ndarray:
    """``[n, d]`` bucket ids < 2^nbits → ``[n, d·nbits/8]`` bytes, first dimension in the high bits."""
    n, d = buckets.shape
    per_byte = 8 // nbits
    if d % per_byte:
        raise ValueError(f"dim {d} is not a multiple of {per_byte} (nbits={nbits})")
    groups = buckets.astype(np.uint8).reshape(n, d // per_byte, per_byte)
    shifts = (nbits * np.arange(per_byte - 1, -1, -1)).astype(np.uint8)
    return np.bitwise_or.reduce(groups << shifts, axis=2).astype(np.uint8)


def unpack_bits(packed: np.ndarray, nbits: int, dim: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``[n, d·nbits/8]`` bytes → ``[n, d]`` bucket ids."""
    per_byte = 8 // nbits
    shifts = (nbits * np.arange(per_byte - 1, -1, -1)).astype(np.uint8)
    mask = np.uint8((1 << nbits) - 1)
    return ((packed[:, :, None] >> shifts) & mask).reshape(packed.shape[0], dim)


class _Centroids:
    """What every codec shares: centroids ``[K, d]`` (float16, unit length: ``centroids``) and their float32
    copy (``_centroids32``), the type of a token's centroid id, and the nearest-centroid assignment."""

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def centroids32(self) -> np.ndarray:
        """The centroids in float32, computed once (searches share this copy: 25 MB at K = 16,384, d = 384)."""
        return self._centroids32

    @property
    def num_centroids(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def code_dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.num_centroids <= 1 << 16 else np.dtype(np.int32)

    def assign(self, vectors: np.ndarray) -> np.ndarray:
        """Nearest centroid of each vector (:func:`_assign`)."""
        if self._assigner is None:
            self._assigner = _assigner(self._centroids32)
        return _assign(self._assigner, vectors)


@dataclass
class ResidualCodec(_Centroids):
    """Centroids ``[K, d]`` (float16, unit length), shared bucket cut-offs and reconstruction values."""

    centroids: np.ndarray  # [K, d] float16
    cutoffs: np.ndarray  # [B - 1] float32, ascending
    weights: np.ndarray  # [B] float32, reconstruction value of each bucket
    nbits: int

    def __post_init__(self) -> None:
        if self.nbits not in NBITS:
            raise ValueError(f"nbits must be one of {NBITS}, got {self.nbits}")
        self.centroids = np.ascontiguousarray(self.centroids, dtype=np.float16)
        self.cutoffs = np.asarray(self.cutoffs, dtype=np.float32)
        self.weights = np.asarray(self.weights, dtype=np.float32)
        if self.weights.shape != (1 << self.nbits,) or self.cutoffs.shape != ((1 << self.nbits) - 1,):
            raise ValueError("bucket tables do not match nbits")
        self._centroids32 = self.centroids.astype(np.float32)
        # Byte → the reconstruction values of the dims it packs: decoding is one gather.
        per_byte = 8 // self.nbits
        every_byte = np.arange(256, dtype=np.uint8).reshape(256, 1)
        self._byte_table_np = np.ascontiguousarray(self.weights[unpack_bits(every_byte, self.nbits, per_byte)])
        self._assigner = None

    @property
    def bytes_per_token(self) -> int:
        return self.dim * self.nbits // 8

    kind = "scalar"

    @property
    def name(self) -> str:
        return f"{self.nbits}bit"

    @classmethod
    def train(cls, sample: np.ndarray, num_centroids: int, nbits: int = 2, *, niter: int = 8,
              seed: int = 0, heldout: float = 0.05) -> "ResidualCodec":
        """Spherical k-means (faiss) on a token sample, then bucket quantiles from the residuals of
        a held-out slice of it (residuals of the training points themselves are optimistically small)."""
        centroids, held, train = _kmeans(sample, num_centroids, niter=niter, seed=seed, heldout=heldout)
        codec = cls(centroids, np.zeros((1 << nbits) - 1), np.zeros(1 << nbits), nbits)
        residuals = (held if len(held) else train) - codec._centroids32[codec.assign(held if len(held) else train)]
        values = residuals.ravel()
        buckets = 1 << nbits
        cutoffs = np.quantile(values, np.arange(1, buckets) / buckets).astype(np.float32)
        weights = np.quantile(values, (np.arange(buckets) + 0.5) / buckets).astype(np.float32)
        return cls(centroids, cutoffs, weights, nbits)

    def state(self) -> dict:
        """What rebuilds this codec (:func:`codec_from_state`): arrays and ints only (``np.savez``, Ray)."""
        return {"kind": self.kind, "centroids": self.centroids, "cutoffs": self.cutoffs, "weights": self.weights,
                "nbits": self.nbits}

    def residual_files(self) -> dict:
        """The store files that hold this codec beside ``centroids.f16``: name → bytes."""
        return {"buckets.f32": np.concatenate([self.cutoffs, self.weights]).astype("<f4").tobytes()}

    def lookup_tables(self, queries: torch.Tensor) -> torch.Tensor:
        """``[L, d]`` query tokens → ``[L, G, 256]``: ``T[i, g, v]`` is query token ``i``'s dot product with
        the residual dimensions that byte value ``v`` encodes at byte position ``g`` (:mod:`.lut`)."""
        per_byte = 8 // self.nbits
        queries = _check_queries(queries, self.dim)
        byte_values = torch.from_numpy(self._byte_table_np)  # [256, per_byte]
        return torch.einsum("igk,vk->igv", queries.reshape(len(queries), self.dim // per_byte, per_byte),
                            byte_values).contiguous()

    def lookup_codes(self, packed: np.ndarray) -> np.ndarray:
        """Stored residual rows → the table columns they read: a packed byte is its own column."""
        return np.asarray(packed)

    def compress(self, vectors: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``[n, d]`` unit vectors → (centroid ids ``[n]``, packed residuals ``[n, d·nbits/8]`` uint8)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected [n, {self.dim}] vectors, got {list(vectors.shape)}")
        codes = self.assign(vectors) if len(vectors) else np.zeros(0, dtype=np.int64)
        residuals = vectors - self._centroids32[codes]
        buckets = np.searchsorted(self.cutoffs, residuals, side="right").astype(np.uint8)
        return codes.astype(self.code_dtype), pack_bits(buckets, self.nbits)

    def decompress(self, codes: np.ndarray, packed: np.ndarray, normalize: bool = True) -> torch.Tensor:
        """Centroid + reconstructed residual for each token: ``[n, d]`` float32 tensor.

        ``np.take`` on the byte table is ~5× faster than fancy indexing or torch's
        ``index_select`` for these tiny rows (measured on 33k tokens: 3.7 vs 18 / 14 ms).
        """
        n = len(codes)
        residuals = np.take(self._byte_table_np, np.ascontiguousarray(packed).reshape(-1), axis=0)
        out = np.take(self._centroids32, np.asarray(codes, dtype=np.int64), axis=0)
        out += residuals.reshape(n, self.dim)
        vectors = torch.from_numpy(out)
        if normalize and n:
            vectors /= vectors.norm(dim=1, keepdim=True).clamp_min_(1e-12)
        return vectors

    def table_form(self, codes: np.ndarray, packed: np.ndarray) -> tuple:
        """``(centroids, codes, groups, table)`` of :func:`agrame.scoring.compressed_run_max`: each residual
        byte is a group, its row of the byte table the ``8 / nbits`` dimensions it codes."""
        return self._centroids32, codes, packed, self._byte_table_np

    def table_queries(self, queries: torch.Tensor) -> torch.Tensor:
        """The queries :meth:`table_form`'s tokens are scored against: these."""
        return queries


def _kmeans(sample: np.ndarray, num_centroids: int, *, niter: int, seed: int, heldout: float):
    """Spherical k-means (faiss) on a token sample less a held-out slice: (float16 centroids, held, train)."""
    import faiss

    sample = np.ascontiguousarray(sample, dtype=np.float32)
    n, d = sample.shape
    order = np.random.default_rng(seed).permutation(n)
    n_held = max(1, int(n * heldout)) if n > 1 else 0
    held, train = sample[order[:n_held]], sample[order[n_held:]] if n_held < n else sample
    k = max(1, min(num_centroids, train.shape[0]))
    kmeans = faiss.Kmeans(d, k, niter=niter, seed=seed, spherical=True, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=1 << 30)
    kmeans.train(train)
    return kmeans.centroids.astype(np.float16), held, train


def _assigner(centroids32: np.ndarray):
    """Exact search for small codebooks; above 4,096 centroids an inverted file over the centroids
    themselves (√K lists, 16 probed), which visits a small share of the centroids per token. A
    near-nearest centroid only widens that token's residual (its effect is inside the measured codec error)."""
    import faiss

    num, dim = centroids32.shape
    if num > 4096:
        nlist = int(2 ** np.ceil(np.log2(np.sqrt(num))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = 0
        index.train(centroids32)
        index.nprobe = 16
    else:
        index = faiss.IndexFlatIP(dim)
    index.add(centroids32)
    return index


def _assign(assigner, vectors: np.ndarray) -> np.ndarray:
    """Nearest centroid (max inner product) of each vector."""
    _, ids = assigner.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    return ids[:, 0].astype(np.int64)


def _check_queries(queries: torch.Tensor, dim: int) -> torch.Tensor:
    queries = queries.float()
    if queries.shape[-1] != dim:
        raise ValueError(f"queries have dimension {queries.shape[-1]}, the codec {dim}")
    return queries


def codes_per_group(nbits: int) -> int:
    """The fewest codes of ``nbits`` that fill whole bytes (lcm(nbits, 8) / nbits)."""
    return 8 // int(np.gcd(nbits, 8))


def _pack_words(codes: np.ndarray, nbits: int) -> np.ndarray:
    """Any ``nbits`` ≤ 8: each group of :func:`codes_per_group` codes one big-endian word of ≤ 56 bits."""
    n, m = codes.shape
    per = codes_per_group(nbits)
    width = per * nbits // 8
    v = codes.astype(np.uint64).reshape(n, m // per, per)
    word = np.zeros((n, m // per), dtype=np.uint64)
    for j in range(per):
        word |= v[:, :, j] << np.uint64(nbits * (per - 1 - j))
    out = np.empty((n, m // per, width), dtype=np.uint8)
    for k in range(width):
        out[:, :, k] = (word >> np.uint64(8 * (width - 1 - k))) & np.uint64(255)
    return out.reshape(n, m // per * width)


def _unpack_words(packed: np.ndarray, nbits: int, m: int) -> np.ndarray:
    n = len(packed)
    per = codes_per_group(nbits)
    width = per * nbits // 8
    groups = packed.reshape(n, m // per, width)
    word = np.zeros((n, m // per), dtype=np.uint64)
    for k in range(width):
        word |= groups[:, :, k].astype(np.uint64) << np.uint64(8 * (width - 1 - k))
    out = np.empty((n, m // per, per), dtype=np.uint8)
    mask = np.uint64((1 << nbits) - 1)
    for j in range(per):
        out[:, :, j] = (word >> np.uint64(nbits * (per - 1 - j))) & mask
    return out.reshape(n, m)


def pack_codes(codes: np.ndarray, nbits: int) -> np.ndarray:
    """``[n, m]`` codes < 2^nbits → ``[n, m·nbits/8]`` bytes, big-endian bit order (first code in the high
    bits). 4 and 8 bits as :func:`pack_bits`; 6 bits: each 3 bytes hold 4 codes; 7 bits: 7 bytes hold 8."""
    codes = np.asarray(codes)
    n, m = codes.shape
    if nbits in (1, 2, 4, 8):
        return pack_bits(codes, nbits)
    if nbits != 6:
        if m % codes_per_group(nbits):
            raise ValueError(f"{m} codes of {nbits} bits are not a whole number of bytes")
        return _pack_words(codes, nbits)
    if m % 4:
        raise ValueError(f"{m} codes of 6 bits are not a whole number of bytes (m must be a multiple of 4)")
    v = codes.astype(np.uint32).reshape(n, m // 4, 4)
    word = (v[:, :, 0] << 18) | (v[:, :, 1] << 12) | (v[:, :, 2] << 6) | v[:, :, 3]
    return np.stack([word >> 16, word >> 8, word], axis=2).astype(np.uint8).reshape(n, 3 * m // 4)


def unpack_codes(packed: np.ndarray, nbits: int, m: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: ``[n, m·nbits/8]`` bytes → ``[n, m]`` uint8 codes."""
    packed = np.asarray(packed)
    if nbits in (1, 2, 4, 8):
        return unpack_bits(packed, nbits, m)
    if nbits != 6:
        return _unpack_words(packed, nbits, m)
    # byte by byte in uint8 (3× faster than assembling 24-bit words in uint32, measured on 40k tokens)
    n = len(packed)
    groups = packed.reshape(n, m // 4, 3)
    b0, b1, b2 = groups[:, :, 0], groups[:, :, 1], groups[:, :, 2]
    out = np.empty((n, m // 4, 4), dtype=np.uint8)
    np.right_shift(b0, 2, out=out[:, :, 0])
    out[:, :, 1] = ((b0 & 3) << 4) | (b1 >> 4)
    out[:, :, 2] = ((b1 & 15) << 2) | (b2 >> 6)
    np.bitwise_and(b2, 63, out=out[:, :, 3])
    return out.reshape(n, m)


class _Codebooks(_Centroids):
    """What a product and an additive codec share beyond the centroids: ``m`` codebooks of ``nbits``-bit codes
    packed per token (:func:`pack_codes`)."""

    @property
    def m(self) -> int:
        return int(self.codebooks.shape[0])

    @property
    def bytes_per_token(self) -> int:
        return self.m * self.nbits // 8

    def lookup_codes(self, packed: np.ndarray) -> np.ndarray:
        return unpack_codes(packed, self.nbits, self.m)


@dataclass
class ProductCodec(_Codebooks):
    """Centroids ``[K, d]`` (float16, unit length) and a product quantizer of the residuals: ``m``
    codebooks of ``2^nbits`` codewords ``[m, 2^nbits, d/m]`` (float32), trained by faiss's k-means.

    With a ``rotation`` ``R`` ([d, d], orthonormal; optimized PQ) the quantizer codes ``r·R`` and a token
    is ``c + r̂·Rᵀ``. Scores need no rotation back: ``q·(c + r̂·Rᵀ) = (q·R)·(c·R + r̂)`` and norms are
    kept, so the compiled exact stage scores rotated queries against rotated centroids plus codewords
    (:meth:`table_queries`, :meth:`table_form`), as cheaply as without a rotation."""

    centroids: np.ndarray  # [K, d] float16
    codebooks: np.ndarray  # [m, 2^nbits, d/m] float32
    nbits: int
    rotation: Optional[np.ndarray] = None  # [d, d] float32: what the quantizer codes is r @ rotation

    kind = "pq"
    #: A codebook is trained on held-out residuals when there are this many per codeword (faiss's own
    #: minimum for a warning-free k-means); a smaller sample trains on every residual it has.
    POINTS_PER_CODEWORD = 39

    def __post_init__(self) -> None:
        if self.nbits not in PQ_NBITS:
            raise ValueError(f"nbits must be one of {PQ_NBITS} for product quantization, got {self.nbits}")
        self.centroids = np.ascontiguousarray(self.centroids, dtype=np.float16)
        self.codebooks = np.ascontiguousarray(self.codebooks, dtype=np.float32)
        m, ksub, dsub = self.codebooks.shape
        if ksub != 1 << self.nbits or m * dsub != self.dim or m % codes_per_group(self.nbits):
            raise ValueError(f"codebooks {list(self.codebooks.shape)} do not fit d = {self.dim} at {self.nbits} bits "
                             "(m must divide d, and m·nbits fill whole bytes)")
        self._centroids32 = self.centroids.astype(np.float32)
        self._table_centroids = self._centroids32
        if self.rotation is not None:
            self.rotation = np.ascontiguousarray(self.rotation, dtype=np.float32)
            if self.rotation.shape != (self.dim, self.dim) or \
                    not np.allclose(self.rotation.T @ self.rotation, np.eye(self.dim), atol=1e-3):
                raise ValueError(f"the rotation must be an orthonormal [{self.dim}, {self.dim}] matrix")
            self._table_centroids = self._centroids32 @ self.rotation
        # codeword j of sub-vector s is row s·2^nbits + j: decoding is one gather of m rows per token
        self._offsets = np.arange(m, dtype=np.int64) * ksub
        self._flat_codebooks = self.codebooks.reshape(m * ksub, dsub)
        self._norms = torch.from_numpy((self.codebooks ** 2).sum(axis=2))  # [m, ksub]
        self._assigner = None

    @property
    def name(self) -> str:
        return f"{'pq' if self.rotation is None else 'opq'}{self.m}x{self.nbits}"

    @classmethod
    def train(cls, sample: np.ndarray, num_centroids: int, nbits: int = 6, m: int = 16, *, niter: int = 8,
              seed: int = 0, heldout: float = 0.05, extra: Optional[np.ndarray] = None,
              rotate: bool = False) -> "ProductCodec":
        """Spherical k-means for the centroids (as :meth:`ResidualCodec.train`), then faiss's product
        quantizer trained on the residuals of vectors k-means did not see: the held-out slice and ``extra``
        (a build's further sample, up to :data:`PQ_TRAIN_POINTS`); of every sample token too, if those are
        too few for ``2^nbits`` codewords a sub-vector. ``rotate``: first faiss's OPQ rotation of those
        residuals (trained on the same points), the quantizer then trained on the rotated ones."""
        import faiss

        centroids, held, train = _kmeans(sample, num_centroids, niter=niter, seed=seed, heldout=heldout)
        dim = centroids.shape[1]
        if dim % m:
            raise ValueError(f"pq{m}x{nbits}: {m} sub-vectors do not divide d = {dim}")
        ksub = 1 << nbits
        residuals = _quantizer_residuals(centroids, held, train, extra, cls.POINTS_PER_CODEWORD * ksub, ksub)
        rotation = None
        if rotate:
            opq = faiss.OPQMatrix(dim, m)
            # (its alternation trains 8-bit codebooks: a tiny index's points repeated to 256, as above)
            opq.train(np.ascontiguousarray(np.resize(residuals, (max(len(residuals), 256), dim)), dtype=np.float32))
            rotation = faiss.vector_to_array(opq.A).reshape(dim, dim).T  # faiss applies x @ Aᵀ
            # (faiss's A is orthonormal in float32; re-orthonormalised so Rᵀ R = I to float32's precision)
            u, _, vt = np.linalg.svd(rotation.astype(np.float64))
            rotation = (u @ vt).astype(np.float32)
            residuals = np.asarray(residuals, dtype=np.float32) @ rotation
        pq = faiss.ProductQuantizer(dim, m, nbits)
        pq.cp.seed = seed
        pq.cp.max_points_per_centroid = 1 << 30
        pq.cp.min_points_per_centroid = 1  # (the choice of points above is ours: no warning for a small index)
        pq.train(np.ascontiguousarray(residuals, dtype=np.float32))
        codebooks = faiss.vector_to_array(pq.centroids).reshape(m, ksub, dim // m)
        return cls(centroids, codebooks, nbits, rotation)

    def state(self) -> dict:
        return {"kind": self.kind, "centroids": self.centroids, "codebooks": self.codebooks, "nbits": self.nbits,
                **({"rotation": self.rotation} if self.rotation is not None else {})}

    def residual_files(self) -> dict:
        return {"pq.f32": self.codebooks.astype("<f4").tobytes(),
                **({"opq.f32": self.rotation.astype("<f4").tobytes()} if self.rotation is not None else {})}

    def quantize(self, residuals: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
        """``[n, d]`` residuals → ``[n, m]`` codes: each sub-vector's nearest codeword (L2)."""
        residuals = np.asarray(residuals, dtype=np.float32)
        out = np.empty((len(residuals), self.m), dtype=np.uint8)
        books = torch.from_numpy(self.codebooks)
        for lo in range(0, len(residuals), chunk):
            r = torch.from_numpy(np.ascontiguousarray(residuals[lo:lo + chunk])).reshape(-1, self.m, self.dim // self.m)
            # ‖r − c‖² = ‖r‖² − 2 r·c + ‖c‖²; ‖r‖² is the same for every codeword of a sub-vector
            distance = self._norms - 2 * torch.einsum("nsk,svk->nsv", r, books)
            out[lo:lo + chunk] = distance.argmin(dim=2).numpy()
        return out

    def compress(self, vectors: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``[n, d]`` unit vectors → (centroid ids ``[n]``, packed codes ``[n, m·nbits/8]`` uint8)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected [n, {self.dim}] vectors, got {list(vectors.shape)}")
        codes = self.assign(vectors) if len(vectors) else np.zeros(0, dtype=np.int64)
        residuals = vectors - self._centroids32[codes]
        if self.rotation is not None:
            residuals = residuals @ self.rotation
        return codes.astype(self.code_dtype), pack_codes(self.quantize(residuals), self.nbits)

    def decompress(self, codes: np.ndarray, packed: np.ndarray, normalize: bool = True) -> torch.Tensor:
        """Centroid + the codewords of each token's sub-vectors: ``[n, d]`` float32 tensor."""
        n = len(codes)
        rows = unpack_codes(packed, self.nbits, self.m).astype(np.int64)
        rows += self._offsets
        out = np.take(self._centroids32, np.asarray(codes, dtype=np.int64), axis=0)
        coded = np.take(self._flat_codebooks, rows.reshape(-1), axis=0).reshape(n, self.dim)
        out += coded if self.rotation is None else coded @ self.rotation.T
        vectors = torch.from_numpy(out)
        if normalize and n:
            vectors /= vectors.norm(dim=1, keepdim=True).clamp_min_(1e-12)
        return vectors

    def table_form(self, codes: np.ndarray, packed: np.ndarray) -> tuple:
        """``(centroids, codes, groups, table)`` of :func:`agrame.scoring.compressed_run_max`: each sub-vector
        is a group, its codeword's row of the stacked codebooks the ``d / m`` dimensions it codes (with a
        rotation, the centroids rotated: the tokens as the quantizer sees them; see :meth:`table_queries`)."""
        return self._table_centroids, codes, scoring.PackedRows(packed, self.nbits, self.m, 1 << self.nbits), \
            self._flat_codebooks

    def table_queries(self, queries: torch.Tensor) -> torch.Tensor:
        """The queries :meth:`table_form`'s tokens are scored against: rotated as they are."""
        return queries if self.rotation is None else queries.float() @ torch.from_numpy(self.rotation)

    def lookup_tables(self, queries: torch.Tensor) -> torch.Tensor:
        """``[L, d]`` → ``[L, m, 2^nbits]``: query token ``i``'s dot product with codeword ``v`` of sub-vector ``s``
        (rotated codewords: the query rotated with them)."""
        queries = self.table_queries(_check_queries(queries, self.dim))
        return torch.einsum("isk,svk->isv", queries.reshape(len(queries), self.m, self.dim // self.m),
                            torch.from_numpy(self.codebooks)).contiguous()



def _quantizer_residuals(centroids: np.ndarray, held: np.ndarray, train: np.ndarray, extra, minimum: int,
                         codewords: int) -> np.ndarray:
    """The residuals a product or additive quantizer learns from: those of the vectors k-means did not see
    (the held-out slice and ``extra``, up to :data:`PQ_TRAIN_POINTS`), of every sample token too where those
    are fewer than ``minimum``; repeated up to ``codewords`` rows for a tiny index (repeated points give
    repeated, never nearer, codewords)."""
    assign = _assigner(centroids.astype(np.float32))
    if extra is not None and len(extra):
        held = np.concatenate([held, np.asarray(extra, dtype=np.float32)])[:PQ_TRAIN_POINTS]
    points = held if len(held) >= minimum else np.concatenate([held, train])
    residuals = points - centroids.astype(np.float32)[_assign(assign, points)]
    if len(residuals) < codewords:
        residuals = np.resize(residuals, (codewords, residuals.shape[1]))
    return np.ascontiguousarray(residuals, dtype=np.float32)


def beam_encode(residuals: torch.Tensor, codebooks: torch.Tensor, beam: int) -> torch.Tensor:
    """Residual quantization's encoder: ``[n, d]`` residuals, ``[m, K, d]`` codebooks → ``[n, m]`` codes, the
    codewords (one a codebook, in order) whose sum approximates each residual. A beam search (faiss's
    ``ResidualQuantizer``, Babenko & Lempitsky 2014): after each codebook the ``beam`` partial sums nearest
    the residual (L2) go on, each extended by every codeword of the next; the nearest full sum wins. With
    ``beam`` 1 this is the greedy stage-by-stage choice."""
    n, d = residuals.shape
    m, k, _ = codebooks.shape
    norms = (codebooks ** 2).sum(dim=2)  # [m, K]
    minus_twice = -2 * codebooks.transpose(1, 2)  # [m, d, K]
    left = residuals[:, None, :]  # [n, b, d]: what each partial sum leaves
    codes = torch.zeros((n, 1, 0), dtype=torch.long)
    for s in range(m):
        # ‖left − c‖² = ‖left‖² − 2 left·c + ‖c‖², for every (beam, codeword), summed in place
        error = left @ minus_twice[s]
        error += norms[s]
        error += (left * left).sum(dim=2, keepdim=True)
        width = min(beam, error.shape[1] * k)
        _, best = error.reshape(n, -1).topk(width, dim=1, largest=False, sorted=True)
        parent, word = best // k, best % k
        left = torch.gather(left, 1, parent[:, :, None].expand(-1, -1, d)) - codebooks[s][word]
        codes = torch.cat([torch.gather(codes, 1, parent[:, :, None].expand(-1, -1, s)), word[:, :, None]], dim=2)
    return codes[:, 0]


@dataclass
class AdditiveCodec(_Codebooks):
    """Centroids ``[K, d]`` (float16, unit length) and a residual quantizer: ``m`` codebooks of ``2^nbits``
    whole ``d``-dimensional codewords ``[m, 2^nbits, d]`` (float32), a token ``c + Σ_s codebooks[s, code_s]``.

    Each codebook is trained on what the earlier ones leave (faiss's ``ResidualQuantizer``); a token's codes
    are chosen by :func:`beam_encode`. At the bytes of a product code it loses less of the residual: every
    codeword spans all dimensions, so the codebooks model how they vary together. Scores read the same tables
    as a product code's (:meth:`table_form`, :meth:`lookup_tables`), each codeword added over all ``d``
    dimensions instead of placed in ``d / m`` of them."""

    centroids: np.ndarray  # [K, d] float16
    codebooks: np.ndarray  # [m, 2^nbits, d] float32
    nbits: int

    kind = "rq"
    #: Partial sums kept at each codebook when coding (faiss's default beam for its residual quantizer).
    BEAM = 5
    #: Residuals a codebook is trained on: faiss trains each on all of them, coding them with the beam
    #: after each stage, so training costs m × (k-means + a coding pass); 2¹⁶ kept a build of the pool's
    #: 4 M tokens in minutes (65,536 = 256 points a codeword).
    TRAIN_POINTS = 1 << 16

    def __post_init__(self) -> None:
        if self.nbits not in PQ_NBITS:
            raise ValueError(f"nbits must be one of {PQ_NBITS} for residual quantization, got {self.nbits}")
        self.centroids = np.ascontiguousarray(self.centroids, dtype=np.float16)
        self.codebooks = np.ascontiguousarray(self.codebooks, dtype=np.float32)
        m, ksub, dim = self.codebooks.shape
        if ksub != 1 << self.nbits or dim != self.dim or m % codes_per_group(self.nbits):
            raise ValueError(f"codebooks {list(self.codebooks.shape)} do not fit d = {self.dim} at {self.nbits} bits "
                             "(whole codewords, and m·nbits filling whole bytes)")
        self._centroids32 = self.centroids.astype(np.float32)
        # codeword j of codebook s is row s·2^nbits + j: decoding is one gather of m rows per token, summed
        self._offsets = np.arange(m, dtype=np.int64) * ksub
        self._flat_codebooks = self.codebooks.reshape(m * ksub, dim)
        self._assigner = None

    @property
    def name(self) -> str:
        return f"rq{self.m}x{self.nbits}"

    @classmethod
    def train(cls, sample: np.ndarray, num_centroids: int, nbits: int = 8, m: int = 14, *, niter: int = 8,
              seed: int = 0, heldout: float = 0.05, extra: Optional[np.ndarray] = None) -> "AdditiveCodec":
        """Spherical k-means for the centroids (as :meth:`ResidualCodec.train`), then faiss's residual
        quantizer trained on at most :data:`TRAIN_POINTS` residuals of vectors k-means did not see (as
        :meth:`ProductCodec.train` chooses them)."""
        centroids, held, train = _kmeans(sample, num_centroids, niter=niter, seed=seed, heldout=heldout)
        residuals = _quantizer_residuals(centroids, held, train, extra, ProductCodec.POINTS_PER_CODEWORD << nbits,
                                         1 << nbits)
        return cls(centroids, cls.train_codebooks(residuals, m, nbits, seed=seed), nbits)

    @classmethod
    def train_codebooks(cls, residuals: np.ndarray, m: int, nbits: int, *, seed: int = 0) -> np.ndarray:
        """``[m, 2^nbits, d]`` codebooks of faiss's residual quantizer (its beam :data:`BEAM`), trained on at
        most :data:`TRAIN_POINTS` of ``residuals`` (a seeded draw)."""
        import faiss

        residuals = np.ascontiguousarray(residuals, dtype=np.float32)
        if len(residuals) > cls.TRAIN_POINTS:
            residuals = residuals[np.sort(np.random.default_rng(seed).choice(len(residuals), cls.TRAIN_POINTS,
                                                                            replace=False))]
        dim = residuals.shape[1]
        rq = faiss.ResidualQuantizer(dim, m, nbits)
        rq.max_beam_size = cls.BEAM
        rq.cp.seed = seed
        rq.cp.max_points_per_centroid = 1 << 30
        rq.cp.min_points_per_centroid = 1
        rq.train(residuals)
        return faiss.vector_to_array(rq.codebooks).reshape(m, 1 << nbits, dim)

    def state(self) -> dict:
        return {"kind": self.kind, "centroids": self.centroids, "codebooks": self.codebooks, "nbits": self.nbits}

    def residual_files(self) -> dict:
        return {"rq.f32": self.codebooks.astype("<f4").tobytes()}

    def quantize(self, residuals: np.ndarray, chunk: int = 512) -> np.ndarray:
        """``[n, d]`` residuals → ``[n, m]`` codes (:func:`beam_encode` with :data:`BEAM`), ``chunk`` at a time:
        a chunk's ``[chunk, beam, 2^nbits]`` distances stay in the CPU's cache (512 residuals coded 2.4× as
        fast as 16,384 at once, one thread, 14 codebooks of 256: a diagnostic run)."""
        residuals = np.asarray(residuals, dtype=np.float32)
        out = np.empty((len(residuals), self.m), dtype=np.uint8)
        books = torch.from_numpy(self.codebooks)
        for lo in range(0, len(residuals), chunk):
            r = torch.from_numpy(np.ascontiguousarray(residuals[lo:lo + chunk]))
            out[lo:lo + chunk] = beam_encode(r, books, self.BEAM).numpy()
        return out

    def compress(self, vectors: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``[n, d]`` unit vectors → (centroid ids ``[n]``, packed codes ``[n, m·nbits/8]`` uint8)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected [n, {self.dim}] vectors, got {list(vectors.shape)}")
        codes = self.assign(vectors) if len(vectors) else np.zeros(0, dtype=np.int64)
        return codes.astype(self.code_dtype), pack_codes(self.quantize(vectors - self._centroids32[codes]), self.nbits)

    def decompress(self, codes: np.ndarray, packed: np.ndarray, normalize: bool = True) -> torch.Tensor:
        """Centroid + the sum of each token's codewords: ``[n, d]`` float32 tensor (added in codebook order,
        as the compiled exact stage adds them)."""
        n = len(codes)
        rows = unpack_codes(packed, self.nbits, self.m).astype(np.int64)
        rows += self._offsets
        out = np.take(self._centroids32, np.asarray(codes, dtype=np.int64), axis=0)
        for s in range(self.m):
            out += np.take(self._flat_codebooks, rows[:, s], axis=0)
        vectors = torch.from_numpy(out)
        if normalize and n:
            vectors /= vectors.norm(dim=1, keepdim=True).clamp_min_(1e-12)
        return vectors

    def table_form(self, codes: np.ndarray, packed: np.ndarray) -> tuple:
        """``(centroids, codes, groups, table)`` of :func:`agrame.scoring.compressed_run_max`: each codebook is
        a group whose rows are as wide as a token, so its codeword is added over every dimension."""
        return self._centroids32, codes, scoring.PackedRows(packed, self.nbits, self.m, 1 << self.nbits), \
            self._flat_codebooks

    def table_queries(self, queries: torch.Tensor) -> torch.Tensor:
        return queries

    def lookup_tables(self, queries: torch.Tensor) -> torch.Tensor:
        """``[L, d]`` → ``[L, m, 2^nbits]``: query token ``i``'s dot product with codeword ``v`` of codebook ``s``
        (a token's residual score is the sum of its ``m`` entries, as a product code's)."""
        queries = _check_queries(queries, self.dim)
        return torch.einsum("ik,svk->isv", queries, torch.from_numpy(self.codebooks)).contiguous()



def codec_from_state(state) -> "ResidualCodec | ProductCodec | AdditiveCodec":
    """A codec's ``state()`` (a dict or an ``np.load`` archive) → the codec."""
    kind = str(state["kind"]) if "kind" in state else "scalar"  # (saved before product codecs existed)
    if kind == "pq":
        return ProductCodec(state["centroids"], state["codebooks"], int(state["nbits"]),
                            state["rotation"] if "rotation" in state else None)
    if kind == "rq":
        return AdditiveCodec(state["centroids"], state["codebooks"], int(state["nbits"]))
    return ResidualCodec(state["centroids"], state["cutoffs"], state["weights"], int(state["nbits"]))


def train_codec_of(spec, sample: np.ndarray, num_centroids: int, *, niter: int = 8, seed: int = 0,
                   extra: Optional[np.ndarray] = None):
    """The codec ``spec`` names (:func:`parse_residuals`) trained on ``sample`` (a product or additive codec's
    quantizer also on ``extra``: vectors outside the k-means sample)."""
    kind, nbits, m = parse_residuals(spec)
    if kind in ("pq", "opq"):
        return ProductCodec.train(sample, num_centroids, nbits, m, niter=niter, seed=seed, extra=extra,
                                  rotate=kind == "opq")
    if kind == "rq":
        return AdditiveCodec.train(sample, num_centroids, nbits, m, niter=niter, seed=seed, extra=extra)
    return ResidualCodec.train(sample, num_centroids, nbits, niter=niter, seed=seed)


class CompressedVectors:
    """Token vectors left compressed until they are read: ``vectors[lo:hi]`` (or ``vectors[rows]``)
    decompresses only those rows (:meth:`ResidualCodec.decompress`).

    Exact scoring reads an :class:`~agrame.corpus.EncodedCorpus` chunk by chunk
    (:func:`agrame.ranker.score_corpus`); given these vectors it decompresses and scores
    ``chunk_tokens`` tokens at a time, so the float32 vectors of a chunk are still in the CPU's cache
    when they are multiplied, instead of a whole candidate set's (1,000 passages: 120k tokens, 180 MB at
    d = 384) going through memory three times. Measured on the pooled index, one thread, 1,000 random
    passages: decompress-then-multiply 110 ms whole, 60 ms in chunks of 2,048 tokens (a diagnostic run)."""

    chunk_tokens = 2048

    def __init__(self, codec: ResidualCodec, codes: np.ndarray, packed: np.ndarray):
        self.codec, self.codes, self.packed = codec, codes, packed
        self.dtype = torch.float32

    @property
    def shape(self) -> Tuple[int, int]:
        return (len(self.codes), self.codec.dim)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, rows) -> torch.Tensor:
        return self.codec.decompress(self.codes[rows], self.packed[rows])

    def decompress(self) -> torch.Tensor:
        return self[:]

    @classmethod
    def concat(cls, parts: "list[CompressedVectors]") -> "CompressedVectors":
        """One set of rows from several that share a codec (a sharded index's shards, as built)."""
        codec = parts[0].codec
        for part in parts[1:]:
            if not same_codec(part.codec, codec):
                raise ValueError("compressed vectors of different codecs cannot be joined")
        return cls(codec, np.concatenate([p.codes for p in parts]), np.concatenate([p.packed for p in parts]))

    def run_max(self, queries: torch.Tensor, lo: int, hi: int, starts: np.ndarray) -> torch.Tensor:
        """:func:`agrame.scoring.compressed_run_max` of rows ``lo:hi`` (``starts`` relative to ``lo``), without
        decompressing them into an array first."""
        return scoring.compressed_run_max(self.codec.table_queries(queries),
                                          *self.codec.table_form(self.codes[lo:hi], self.packed[lo:hi]), starts)



def same_codec(a, b) -> bool:
    """Whether two codecs decode every code alike (the same kind, bits, centroids and tables)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True
