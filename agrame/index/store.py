"""The compressed token store of an ``agrame-index/2`` folder: writing (streamed build,
``add``) and reading (memory-mapped gathers of whole passages).

Files (raw little-endian arrays, all append-only except the per-generation inverted file):

=====================  ==========================================================
``centroids.f16``      ``[K, d]`` unit centroids (:mod:`agrame.index.codec`)
``buckets.f32``        bucket cut-offs ``[B-1]`` then reconstruction values ``[B]`` (scalar residuals)
``pq.f32``             instead, with product-quantized residuals (``"pq_subvectors": m``): the codebooks
                       ``[m, 2^nbits, d/m]``; ``opq.f32``: with ``"pq_rotation": true``, the ``[d, d]``
                       rotation the residuals are quantized after (OPQ)
``rq.f32``             instead, with additive residual codes (``"rq_codebooks": m``): the codebooks
                       ``[m, 2^nbits, d]``
``codes.bin``          ``[T]`` centroid id per token (uint16 when K ≤ 65,536, else int32)
``residuals.bin``      ``[T, d·nbits/8]`` packed residual buckets, or ``[T, m·nbits/8]`` packed PQ / RQ codes
``sentence_tokens.bin`` ``[S, 2]`` int32 token rows (passage-local, end exclusive) of each sentence
``tokens.bin``         instead of ``sentence_tokens.bin`` when the manifest says ``"token_offsets":
                       "stored"``: character start (int32) and length (uint16) of each token
``doclens.bin``        ``[N]`` int32 tokens per passage
``sentcounts.bin``     ``[N]`` int32 sentences per passage
``sentences.bin``      ``[S, 2]`` int32 character spans of the sentences, passage by passage
``passages.jsonl``     ``{"id", "text", "spans"?}`` per passage (text excluded from size targets)
``passage_offsets.bin`` ``[N]`` int64 byte offset of each passage's line (random access to hits)
``pool.bin``           in a pooled index (``"pool_factor"`` > 1): one byte per *original* token, which
                       stored vector it went to (:func:`agrame.pooling.encode_assignment`; with the
                       tokenizer's offsets it gives the vectors' offsets back)
``origlens.bin``       in a pooled index: ``[N]`` int32 original tokens per passage
``ivf-G.offsets.bin``  ``[K+1]`` int64 CSR starts; ``ivf-G.pids.bin``: passages per centroid, varint gaps
                       (``"ivf_pids": "varint"``) or int32 (no field, before 2026-11-29; :mod:`.ivf`); neither
                       since 2026-12-01 (``"ivf_pids": "derived"``: the lists rebuilt from ``codes.bin`` at open)
=====================  ==========================================================

Token offsets are not stored by default (``"token_offsets": "tokenizer"``: 6 of ~44 bytes per
token at 128-d and 2 bits): tokenisation is deterministic, so :meth:`Encoder.passage_offsets`
recomputes them from the text where they are needed — span searches and explanations, a few
passages each (checked against each passage's token count). Sentence searches need only which
tokens each sentence holds: a sentence's tokens are consecutive rows (tokens in text order,
sentences sorted and disjoint), so ``sentence_tokens.bin`` keeps their range (~0.3 B per token;
what :func:`agrame.spans.token_segments` gives, checked when written). The tokenizer costs
~0.4 ms per passage here — too slow to run on every survivor of a sentence search. A build writes into a temporary folder renamed into place; an ``add`` appends
past the committed sizes and commits by replacing the manifest (:mod:`agrame.index.format`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import zlib
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import __version__
from ..corpus import EncodedCorpus, Passage
from ..encoder import EncodedPassage, Encoder
from ..pooling import check_pool_factor, decode_assignment, pool_passage, pooled_offsets
from ..spans import normalize_span, sorted_token_segments, split_sentences
from .codec import (PQ_TRAIN_POINTS, AdditiveCodec, CompressedVectors, ProductCodec, ResidualCodec, num_centroids,
                    parse_residuals, residuals_option, same_codec, train_codec_of)
from .format import (FORMAT_V2, IVF_PIDS, MANIFEST, IndexDamagedError, IndexFolderError, check_files, crc32_file, ivf_generation,
                     model_block, read_manifest, replace_file, store_root, writing, VERIFY_LIMIT)
from .ivf import InvertedFile, _ranges, build_ivf, decode_varint, derive_ivf, encode_varint, unique_pairs
from .metadata import DIGEST_FIELD, METADATA_FILE, MetadataDB

TOKEN_DTYPE = np.dtype([("start", "<i4"), ("length", "<u2")])
TOKENS_FILE = "tokens.bin"
SENTENCE_TOKENS_FILE = "sentence_tokens.bin"
POOL_FILE = "pool.bin"
ORIGLENS_FILE = "origlens.bin"
APPEND_FILES = ("codes.bin", "residuals.bin", "doclens.bin", "sentcounts.bin", "sentences.bin",
                "passages.jsonl", "passage_offsets.bin")


def append_files(store_offsets: bool, pooled: bool = False) -> Tuple[str, ...]:
    return APPEND_FILES + ((TOKENS_FILE,) if store_offsets else (SENTENCE_TOKENS_FILE,)) + \
        ((POOL_FILE, ORIGLENS_FILE) if pooled else ())


def default_pool_factor(encoder, given=None):
    """``given`` if not None, else the pool factor the model is shipped for (its settings'), else 1."""
    if given is not None:
        return check_pool_factor(given)
    return check_pool_factor(getattr(getattr(encoder, "settings", None), "pool_factor", 1))


def default_residuals(encoder, given=None):
    """``given`` if not None, else the residual codec the model is shipped for (its settings'
    ``residuals``), else 2 bits a dimension: an int (bits) or a ``"pqMxB"`` / ``"rqMxB"`` name."""
    return residuals_option(given if given is not None else
                            getattr(getattr(encoder, "settings", None), "residuals", 2))


def pool_factor(manifest: dict):
    """The pool factor an index was built with (1: one vector per token; every index written before
    pooling)."""
    return manifest.get("pool_factor", 1)
#: k-means training points per centroid. faiss suggests ≥ 39; ColBERTv2 trains on ~96% of a
#: 34k-passage corpus on a GPU. On 2 CPU cores the k-means cost (points × K × d per
#: iteration) must stay within minutes, so the sample is K × this (measured in benchmarks).
POINTS_PER_CENTROID = 8
#: Filter masks a generation keeps (:meth:`Store.allowed`).
FILTER_CACHE = 64
KMEANS_NITER = 8


class _Appender:
    """Appends arrays to the store files, tracking sizes and running CRC-32s."""

    def __init__(self, folder: Path, files: Dict[str, dict], store_offsets: bool, pooled: bool = False):
        self.folder = folder
        self.files = {name: dict(info) for name, info in files.items()}
        self.handles = {}
        self.store_offsets, self.pooled = store_offsets, pooled
        for name in append_files(store_offsets, pooled):
            info = self.files.setdefault(name, {"size": 0, "crc32": 0})
            f = open(folder / name, "r+b" if (folder / name).exists() else "w+b")
            f.truncate(info["size"])  # drop an interrupted append beyond the committed size
            f.seek(info["size"])
            self.handles[name] = f

    def write(self, name: str, data: bytes) -> int:
        import zlib

        info = self.files[name]
        at = info["size"]
        with writing(name):
            self.handles[name].write(data)
        info["size"] += len(data)
        info["crc32"] = zlib.crc32(data, info["crc32"])
        return at

    def close(self) -> None:
        failed = None
        for name, f in self.handles.items():
            try:
                with writing(name):
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException as exc:  # close every handle, then say which file failed first
                failed = failed or exc
            finally:
                try:
                    f.close()
                except OSError:
                    pass  # its unwritten buffer: the flush above already failed and said so
        if failed is not None:
            raise failed


def _write_fixed(folder: Path, name: str, data: bytes, files: Dict[str, dict]) -> None:
    import zlib

    replace_file(folder, name, data)
    files[name] = {"size": len(data), "crc32": zlib.crc32(data)}


def _passage_sentences(passage: Passage, given) -> List[Tuple[int, int]]:
    return split_sentences(passage.text) if given is None else [tuple(s) for s in given]


class CompressedBlock(NamedTuple):
    """Consecutive passages encoded and compressed, ready to append: what an encoding worker (a local
    loop or a Ray actor, :mod:`agrame.index.distributed`) hands to the one process that writes."""

    codes: np.ndarray
    residuals: np.ndarray
    token_rows: np.ndarray  # sentence token rows, or the token table when offsets are stored
    doclens: np.ndarray
    sentcounts: np.ndarray
    sentences: np.ndarray
    lines: List[bytes]  # passages.jsonl records
    has_spans: bool
    codes_per_token: Optional[np.ndarray] = None  # pool.bin rows of a pooled index (one per original token)
    origlens: Optional[np.ndarray] = None  # origlens.bin rows (original tokens per passage)


def compress_block(codec: ResidualCodec, passages: Sequence[Passage], encoded: Sequence[EncodedPassage],
                   sentences: Optional[Sequence] = None, *, store_offsets: bool = False,
                   pool_factor=1) -> CompressedBlock:
    """Compress encoded passages into the rows of every store file (pure: no file is touched);
    ``pool_factor`` > 1 pools each passage's token vectors within its sentences first."""
    spans = [_passage_sentences(p, None if sentences is None else sentences[i]) for i, p in enumerate(passages)]
    for p, sp in zip(passages, spans):
        if any(b[0] < a[1] for a, b in zip(sp, sp[1:])):
            raise ValueError(f"passage {p.id!r}: sentence spans must be in order and disjoint")
    assigned = origlens = None
    original = encoded  # (a pooled index stores its original tokens' offsets, when it stores offsets)
    if pool_factor != 1:
        pooled = [pool_passage(e.vectors, e.offsets, sp, pool_factor) for e, sp in zip(encoded, spans)]
        origlens = np.array([len(e.offsets) for e in encoded], dtype=np.int32)
        encoded = [EncodedPassage(v, o) for v, o, _ in pooled]
        assigned = np.concatenate([c for _, _, c in pooled]) if pooled else np.zeros(0, np.uint8)
    vectors = np.concatenate([e.vectors.numpy() for e in encoded]) if encoded else np.zeros((0, codec.dim))
    codes, residuals = codec.compress(vectors)
    doclens = np.array([len(e.offsets) for e in encoded], dtype=np.int32)
    sentcounts = np.array([len(s) for s in spans], dtype=np.int32)
    flat = np.array([x for s in spans for x in s], dtype=np.int32).reshape(-1, 2)
    rows = (_token_table(original) if store_offsets else _sentence_rows(passages, encoded, flat, sentcounts, doclens))
    lines, has_spans = [], False
    for p in passages:
        record = {"id": p.id, "text": p.text}
        if p.spans is not None:
            has_spans = True
            record["spans"] = [[list(piece) for piece in normalize_span(s, len(p.text))] for s in p.spans]
        lines.append((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    return CompressedBlock(codes, np.ascontiguousarray(residuals), rows, doclens, sentcounts, flat, lines, has_spans,
                           assigned, origlens)


class _ChunkWriter:
    """Compress encoded passages and append them (one place for build and add).

    ``check_offsets``: the tokenizer's offsets of texts (:meth:`Encoder.passage_offsets`), compared
    with those of vectors computed elsewhere (``build_compressed(encoded=…)``) when the index does
    not store offsets — a search would recompute them and must find the same tokens.
    """

    def __init__(self, appender: _Appender, codec: ResidualCodec, first_pid: int, check_offsets=None,
                 pool_factor=1):
        self.out, self.codec, self.next_pid = appender, codec, first_pid
        self.check_offsets = None if appender.store_offsets else check_offsets
        self.pool_factor = pool_factor
        self.pairs: List[np.ndarray] = []
        self.has_spans = False
        self.tokens = 0
        self.original_tokens = 0
        self.sentences = 0

    def write(self, passages: Sequence[Passage], encoded: Sequence[EncodedPassage],
              sentences: Optional[Sequence] = None) -> None:
        if self.check_offsets is not None:
            _check_offsets(passages, encoded, self.check_offsets)
        self.append(compress_block(self.codec, passages, encoded, sentences, store_offsets=self.out.store_offsets,
                                   pool_factor=self.pool_factor))

    def append(self, block: CompressedBlock) -> None:
        n = len(block.doclens)
        pids = np.repeat(np.arange(self.next_pid, self.next_pid + n, dtype=np.int64), block.doclens)
        self.pairs.append(unique_pairs(block.codes, pids))
        if (block.codes_per_token is not None) != self.out.pooled:
            raise IndexFolderError("a pooled block for an unpooled store, or the other way round")
        self.out.write("codes.bin", block.codes.tobytes())
        self.out.write("residuals.bin", block.residuals.tobytes())
        if block.codes_per_token is not None:
            self.out.write(POOL_FILE, block.codes_per_token.astype(np.uint8).tobytes())
            self.out.write(ORIGLENS_FILE, block.origlens.astype("<i4").tobytes())
        self.out.write(TOKENS_FILE if self.out.store_offsets else SENTENCE_TOKENS_FILE, block.token_rows.tobytes())
        self.out.write("doclens.bin", block.doclens.tobytes())
        self.out.write("sentcounts.bin", block.sentcounts.tobytes())
        self.out.write("sentences.bin", block.sentences.tobytes())
        starts = [self.out.write("passages.jsonl", line) for line in block.lines]
        self.out.write("passage_offsets.bin", np.array(starts, dtype=np.int64).tobytes())
        self.has_spans = self.has_spans or block.has_spans
        self.next_pid += n
        self.tokens += int(block.doclens.sum())
        self.original_tokens += int(block.doclens.sum()) if block.origlens is None else int(block.origlens.sum())
        self.sentences += int(block.sentcounts.sum())


def token_sentences_from_rows(rows: np.ndarray, sent_counts: np.ndarray, doclens: np.ndarray) -> np.ndarray:
    """Passage-local sentence id of every token of consecutive passages (−1 outside every
    sentence), from each sentence's token rows ``[S, 2]`` (``sentence_tokens.bin``)."""
    sent_counts, doclens = np.asarray(sent_counts, np.int64), np.asarray(doclens, np.int64)
    rows = np.asarray(rows, np.int64).reshape(-1, 2)
    out = np.full(int(doclens.sum()), -1, dtype=np.int64)
    passage_start = np.concatenate([[0], np.cumsum(doclens)[:-1]])
    first_sentence = np.concatenate([[0], np.cumsum(sent_counts)[:-1]])
    local = np.arange(len(rows)) - np.repeat(first_sentence, sent_counts)
    lengths = rows[:, 1] - rows[:, 0]
    starts = np.repeat(passage_start, sent_counts) + rows[:, 0]
    out[_ranges(starts, lengths)] = np.repeat(local, lengths)
    return out


def _sentence_rows(passages: Sequence[Passage], encoded: Sequence[EncodedPassage], flat: np.ndarray,
                   sent_counts: np.ndarray, doclens: np.ndarray) -> np.ndarray:
    """``[S, 2]`` int32 token rows of each sentence (empty: ``(0, 0)``), checked to give back
    :func:`agrame.spans.token_segments` exactly."""
    import torch

    if not len(flat):
        return np.zeros((0, 2), dtype=np.int32)
    offsets = torch.cat([e.offsets for e in encoded])
    token_passage = torch.repeat_interleave(torch.arange(len(encoded)), torch.from_numpy(doclens.astype(np.int64)))
    span_starts = np.concatenate([[0], np.cumsum(sent_counts)])
    local = sorted_token_segments(offsets, torch.from_numpy(flat.astype(np.int64)), token_passage,
                                  torch.from_numpy(span_starts)).numpy()
    owner = token_passage.numpy()
    row = np.arange(len(local)) - np.concatenate([[0], np.cumsum(doclens)[:-1]])[owner]
    hit = local >= 0
    sentence = local[hit] + span_starts[owner[hit]]
    first = np.full(len(flat), np.iinfo(np.int64).max)
    last = np.zeros(len(flat), dtype=np.int64)
    np.minimum.at(first, sentence, row[hit])
    np.maximum.at(last, sentence, row[hit] + 1)
    rows = np.stack([np.where(last > 0, first, 0), last], axis=1)
    again = token_sentences_from_rows(rows, sent_counts, doclens)
    if not np.array_equal(again, local):
        bad = int(owner[np.flatnonzero(again != local)[0]])
        raise IndexFolderError(f"passage {passages[bad].id!r}: the tokens of a sentence are not consecutive "
                               "(a zero-width token inside it?); index it with store_offsets=True")
    return rows.astype(np.int32)


def _token_table(encoded: Sequence[EncodedPassage]) -> np.ndarray:
    offsets = np.concatenate([e.offsets.numpy() for e in encoded]) if encoded else np.zeros((0, 2), np.int64)
    tokens = np.zeros(len(offsets), dtype=TOKEN_DTYPE)
    tokens["start"] = offsets[:, 0]
    lengths = offsets[:, 1] - offsets[:, 0]
    if lengths.size and lengths.max() > np.iinfo(np.uint16).max:
        raise IndexFolderError("a token spans more than 65,535 characters")
    tokens["length"] = lengths
    return tokens


def _encode_chunks(encoder: Encoder, passages: Sequence[Passage], chunk: int, batch_size: int,
                   cached: Dict[int, EncodedPassage], bar) -> Iterator[Tuple[int, List[Passage], List[EncodedPassage]]]:
    for lo in range(0, len(passages), chunk):
        part = list(passages[lo:lo + chunk])
        todo = [i for i in range(lo, lo + len(part)) if i not in cached]
        fresh = dict(zip(todo, encoder.encode_passages([passages[i].text for i in todo], batch_size=batch_size)
                               if todo else []))
        encoded = [cached.pop(i) if i in cached else fresh[i] for i in range(lo, lo + len(part))]
        if bar is not None:
            bar.update(len(part))
        yield lo, part, encoded


def _sample_vectors(cached: Dict[int, EncodedPassage], passages: Sequence[Passage], sentences,
                    pool_factor, memo: Dict[int, np.ndarray]) -> List[np.ndarray]:
    """The codec's training vectors of the sampled passages: pooled as the index stores them."""
    if pool_factor == 1:
        return [e.vectors.numpy() for e in cached.values()]
    for i, e in cached.items():
        if i not in memo:
            spans = _passage_sentences(passages[i], None if sentences is None else sentences[i])
            memo[i] = pool_passage(e.vectors, e.offsets, spans, pool_factor)[0].numpy()
    return [memo[i] for i in cached]


def train_codec(encoder: Encoder, passages: Sequence[Passage], nbits: int, *, batch_size: int = 16,
                seed: int = 0, points_per_centroid: int = POINTS_PER_CENTROID,
                progress: bool = False, pool_factor=1,
                sentences: Optional[Sequence] = None) -> Tuple[ResidualCodec, Dict[int, EncodedPassage], dict]:
    """Encode a random sample of passages, choose K from the estimated count of stored vectors (pooled,
    with ``pool_factor`` > 1), train the codec on the sample's vectors as they will be stored.

    Returns the codec, the sample's encodings (reused by the build, not encoded twice) and
    a description of the choice for the manifest.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(passages))
    cached: Dict[int, EncodedPassage] = {}
    memo: Dict[int, np.ndarray] = {}
    taken = 0
    first = min(len(passages), 256)
    needed = None
    while taken < len(order):
        step = first if needed is None else min(len(order) - taken, max(64, taken // 2))
        idx = [int(i) for i in order[taken:taken + step]]
        for i, enc in zip(idx, encoder.encode_passages([passages[i].text for i in idx], batch_size=batch_size,
                                                       progress=progress)):
            cached[i] = enc
        taken += len(idx)
        vectors = _sample_vectors(cached, passages, sentences, pool_factor, memo)
        sample_tokens = sum(len(v) for v in vectors)
        estimate = int(round(sample_tokens / taken * len(passages)))
        k = num_centroids(estimate)
        needed = k * points_per_centroid
        if sample_tokens >= needed:
            break
    sample = np.concatenate(vectors)
    extra = None  # (a product codec's quantizer also learns from the sampled vectors k-means does not take)
    if len(sample) > needed:
        chosen = rng.choice(len(sample), needed, replace=False)
        rest = np.ones(len(sample), dtype=bool)
        rest[chosen] = False
        sample, extra = sample[chosen], sample[rest]
    started = time.perf_counter()
    codec = train_codec_of(nbits, sample, k, niter=KMEANS_NITER, seed=seed, extra=extra)
    info = {"estimated_tokens": estimate, "num_centroids": codec.num_centroids, "rule": "2^floor(log2(16·√T))",
            "kmeans_points": int(len(sample)), "kmeans_niter": KMEANS_NITER, "sample_passages": taken,
            "kmeans_seconds": round(time.perf_counter() - started, 1), "seed": seed}
    return codec, cached, info


def _codec_files(folder: Path, codec: ResidualCodec, files: Dict[str, dict]) -> None:
    _write_fixed(folder, "centroids.f16", codec.centroids.tobytes(), files)
    for name, data in codec.residual_files().items():
        _write_fixed(folder, name, data, files)


def codec_fields(codec: ResidualCodec) -> dict:
    """The manifest's fields for a codec: ``nbits`` (bits a dimension; of a product code, bits a code) and,
    for a product codec, ``pq_subvectors`` (and ``pq_rotation`` with an OPQ rotation, in ``opq.f32``), for an
    additive one ``rq_codebooks``."""
    return {"nbits": codec.nbits, **({"pq_subvectors": codec.m} if codec.kind == "pq" else {}),
            **({"rq_codebooks": codec.m} if codec.kind == "rq" else {}),
            **({"pq_rotation": True} if getattr(codec, "rotation", None) is not None else {})}


def read_codec(root: Path, m: dict) -> ResidualCodec:
    """The codec files of a store folder, as its manifest describes them (sizes already checked)."""
    K, d = m["num_centroids"], m["dim"]
    centroids = np.fromfile(root / "centroids.f16", dtype=np.float16, count=K * d).reshape(K, d)
    if "pq_subvectors" in m:
        sub, ksub = m["pq_subvectors"], 1 << m["nbits"]
        books = np.fromfile(root / "pq.f32", dtype="<f4", count=d * ksub).reshape(sub, ksub, d // sub)
        rotation = np.fromfile(root / "opq.f32", dtype="<f4", count=d * d).reshape(d, d) if m.get("pq_rotation") else None
        return ProductCodec(centroids, books, m["nbits"], rotation)
    if "rq_codebooks" in m:
        books = np.fromfile(root / "rq.f32", dtype="<f4", count=m["rq_codebooks"] * (1 << m["nbits"]) * d)
        return AdditiveCodec(centroids, books.reshape(m["rq_codebooks"], 1 << m["nbits"], d), m["nbits"])
    B = 1 << m["nbits"]
    buckets = np.fromfile(root / "buckets.f32", dtype="<f4", count=2 * B - 1)
    return ResidualCodec(centroids, buckets[:B - 1], buckets[B - 1:], m["nbits"])


def ivf_pids(manifest: dict) -> str:
    """How an index's inverted file stores its passages (:data:`~.ivf.IVF_PIDS`)."""
    return manifest.get("ivf_pids", IVF_PIDS[0])


#: How a new index keeps its inverted file (:data:`~.format.IVF_PIDS`): derived from its codes at open.
NEW_IVF_PIDS = "derived"


def _ivf_files(folder: Path, ivf: InvertedFile, generation: int, files: Dict[str, dict], encoding: str) -> None:
    """The inverted file's two files, for an index that stores them (``encoding`` ``"varint"`` or ``"int32"``)."""
    if encoding == "derived":
        return
    _write_fixed(folder, f"ivf-{generation}.offsets.bin", ivf.offsets.astype("<i8").tobytes(), files)
    _write_fixed(folder, f"ivf-{generation}.pids.bin",
                 encode_varint(ivf) if encoding == "varint" else ivf.pids.astype("<i4").tobytes(), files)


def write_store(folder: Path, encoder: Encoder, passages: Sequence[Passage], *, nbits=None,
                batch_size: int = 16, chunk_passages: int = 1024, progress: bool = True,
                sentences: Optional[Sequence] = None, codec: Optional[ResidualCodec] = None,
                encoded: Optional[EncodedCorpus] = None, seed: int = 0, store_offsets: bool = False,
                generation: int = 1, pool_factor=None) -> dict:
    """Write every store file of ``passages`` into ``folder`` (metadata included); the manifest that
    would commit them (not written: the caller commits). ``pool_factor``: :mod:`agrame.pooling` (None:
    the model's own, :func:`default_pool_factor`); ``nbits``: the residual codec (None: the model's own,
    :func:`default_residuals`)."""
    pool_factor = default_pool_factor(encoder, pool_factor)
    nbits = default_residuals(encoder, nbits)
    bar = None
    try:
        source = (None if encoded is None else
                  VectorSource(encoded) if isinstance(encoded, EncodedCorpus) else encoded)
        if codec is None:
            codec, cached, codec_info = (train_codec_from(source, nbits, seed=seed, pool_factor=pool_factor)
                                         if source is not None else
                                         train_codec(encoder, passages, nbits, batch_size=batch_size, seed=seed,
                                                     progress=progress, pool_factor=pool_factor,
                                                     sentences=sentences))
        else:
            cached, codec_info = {}, {"num_centroids": codec.num_centroids, "given": True}
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(passages), desc="indexing", unit="psg", disable=None)
        check = None if source is None or store_offsets else encoder.passage_offsets
        chunks = (source.chunks(passages, chunk_passages, bar) if source is not None else
                  _encode_chunks(encoder, passages, chunk_passages, batch_size, cached, bar))

        def blocks() -> Iterator[CompressedBlock]:
            for lo, part, enc in chunks:
                if check is not None:
                    _check_offsets(part, enc, check)
                yield compress_block(codec, part, enc, None if sentences is None else sentences[lo:lo + len(part)],
                                     store_offsets=store_offsets, pool_factor=pool_factor)

        return write_blocks(folder, model_block(encoder), codec, codec_info, passages, blocks(),
                            store_offsets=store_offsets, generation=generation, pool_factor=pool_factor)
    finally:
        if bar is not None:
            bar.close()


def _check_offsets(passages: Sequence[Passage], encoded: Sequence[EncodedPassage], offsets_of) -> None:
    import torch

    for p, e, again in zip(passages, encoded, offsets_of([p.text for p in passages])):
        if not torch.equal(e.offsets, again):
            raise IndexFolderError(f"passage {p.id!r}: its vectors' token offsets differ from what the "
                                   "model's tokenizer gives its text (encoded by another model or text?)")


def write_blocks(folder: Path, model: dict, codec: ResidualCodec, codec_info: dict, passages: Sequence[Passage],
                 blocks, *, store_offsets: bool = False, generation: int = 1, pool_factor=1) -> dict:
    """Append compressed blocks (:func:`compress_block`, in passage order) as a new store in ``folder``:
    codec, token files, inverted file, metadata; returns the manifest that would commit them."""
    files: Dict[str, dict] = {}
    _codec_files(folder, codec, files)
    out = _Appender(folder, files, store_offsets, pooled=pool_factor != 1)
    writer = _ChunkWriter(out, codec, 0, pool_factor=pool_factor)
    for block in blocks:
        writer.append(block)
    out.close()
    if writer.next_pid != len(passages):
        raise IndexFolderError(f"{writer.next_pid} passages written for {len(passages)} given")
    files.update(out.files)
    if NEW_IVF_PIDS != "derived":  # (else no inverted file: the lists are derived from the codes at open)
        _ivf_files(folder, build_ivf(np.concatenate(writer.pairs), codec.num_centroids), generation, files,
                   NEW_IVF_PIDS)
    db = MetadataDB(folder / METADATA_FILE, writable=True, create=True)
    try:
        digest = db.insert((pos, p.id, p.metadata) for pos, p in enumerate(passages))
    finally:
        db.close()
    return {
        "format": FORMAT_V2, "generation": generation, "agrame_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model, "dim": codec.dim, **codec_fields(codec),
        "num_centroids": codec.num_centroids, "code_dtype": codec.code_dtype.str,
        "codec": codec_info, "num_passages": writer.next_pid, "num_tokens": writer.tokens,
        "num_sentences": writer.sentences, "has_spans": writer.has_spans,
        "token_offsets": "stored" if store_offsets else "tokenizer", "files": files,
        "metadata": METADATA_FILE, DIGEST_FIELD: digest, "ivf_pids": NEW_IVF_PIDS,
        **({"pool_factor": pool_factor, "num_original_tokens": writer.original_tokens} if pool_factor != 1 else {}),
        # the budgets chosen for this model (its settings'), else the package's at search time
        **({"search": dict(model["settings"]["search"])} if model.get("settings", {}).get("search") else {}),
    }


class VectorSource:
    """Vectors already encoded (an :class:`EncodedCorpus`, e.g. a version-1 index) as build input."""

    def __init__(self, corpus: EncodedCorpus):
        self.corpus = corpus

    @property
    def num_tokens(self) -> int:
        return self.corpus.num_tokens

    def sample_vectors(self, n: int, seed: int) -> np.ndarray:
        rows = np.sort(np.random.default_rng(seed).choice(self.num_tokens, n, replace=False))
        return np.asarray(self.corpus.vectors[rows], dtype=np.float32)

    def passage(self, p: int) -> EncodedPassage:
        import torch

        sl = self.corpus.passage_tokens(p)
        vectors = self.corpus.vectors[sl]
        vectors = torch.from_numpy(np.asarray(vectors, dtype=np.float32)) if isinstance(vectors, np.ndarray) \
            else vectors.float()
        return EncodedPassage(vectors, self.corpus.offsets[sl])

    def chunks(self, passages, chunk, bar):
        for lo in range(0, len(passages), chunk):
            part = list(passages[lo:lo + chunk])
            if bar is not None:
                bar.update(len(part))
            yield lo, part, [self.passage(p) for p in range(lo, lo + len(part))]


def train_codec_from(source: "VectorSource", nbits: int, *, seed: int = 0,
                     points_per_centroid: int = POINTS_PER_CENTROID, pool_factor=1):
    """:func:`train_codec` for vectors already encoded (the token count is known, not estimated; a pooled
    build's is taken as tokens / factor). A pooled build from an :class:`EncodedCorpus` trains on pooled
    vectors of randomly drawn passages (another source: on its tokens)."""
    k = num_centroids(int(source.num_tokens / pool_factor))
    needed = min(int(source.num_tokens / pool_factor), k * points_per_centroid)
    if pool_factor != 1 and isinstance(source, VectorSource):
        rng = np.random.default_rng(seed)
        order, parts, have = rng.permutation(len(source.corpus)), [], 0
        for lo in range(0, len(order), 512):
            part = source.corpus.select(order[lo:lo + 512].tolist()).pooled(pool_factor)
            parts.append(np.asarray(part.vectors, dtype=np.float32))
            have += len(parts[-1])
            if have >= needed:
                break
        sample = np.concatenate(parts)
        chosen = np.zeros(len(sample), dtype=bool)
        chosen[rng.choice(len(sample), min(needed, len(sample)), replace=False)] = True
        sample, extra = sample[chosen], sample[~chosen]
    else:
        sample = source.sample_vectors(needed, seed)
        # a product codec's quantizer: a further draw (another seed; k-means took a small share of the tokens)
        extra = source.sample_vectors(min(source.num_tokens, PQ_TRAIN_POINTS), seed + 1) \
            if parse_residuals(nbits)[0] != "scalar" else None
    started = time.perf_counter()
    codec = train_codec_of(nbits, sample, k, niter=KMEANS_NITER, seed=seed, extra=extra)
    return codec, {}, {"estimated_tokens": source.num_tokens, "num_centroids": codec.num_centroids,
                       "rule": "2^floor(log2(16·√T))", "kmeans_points": int(needed), "kmeans_niter": KMEANS_NITER,
                       "kmeans_seconds": round(time.perf_counter() - started, 1), "seed": seed}


def gather(parts: Sequence[Tuple["Store", Sequence[int]]], with_sentences: bool = True, with_offsets: bool = True,
           lazy: bool = False) -> EncodedCorpus:
    """One :class:`EncodedCorpus` of the passages ``pids`` of each ``(store, pids)`` part, in that order:
    :meth:`Store.corpus` of one store, or of several that share a codec (a sharded index's shards) in
    one pass — each store gives its rows of the codes and tables, the corpus is numbered and laid out
    once (S stores' corpora joined afterwards cost ~0.3 ms a shard more; a diagnostic profile).
    Flags as :meth:`Store.corpus`."""
    import torch

    parts = [(store, np.asarray(pids, dtype=np.int64)) for store, pids in parts]
    codec = parts[0][0].codec
    for store, _ in parts[1:]:
        if store.codec is not codec and not same_codec(store.codec, codec):
            raise ValueError("passages of stores with different codecs cannot be gathered into one corpus")
    rows = [store.token_rows(pids) for store, pids in parts]
    doclens_np = _joined_rows([store.doclens[pids] for store, pids in parts]).astype(np.int64, copy=False)
    vectors = CompressedVectors(codec, _joined_rows([store.codes[r] for (store, _), r in zip(parts, rows)]),
                                _joined_rows([store.residuals[r] for (store, _), r in zip(parts, rows)]))
    if not lazy:
        vectors = vectors.decompress()
    n, num_tokens = len(doclens_np), int(doclens_np.sum())
    doclens = torch.from_numpy(doclens_np)
    # numpy's repeat: torch's repeat_interleave costs ~0.25 ms even on a few passages (a diagnostic run)
    token_passage = torch.from_numpy(np.repeat(np.arange(n), doclens_np))
    passage_starts = torch.cat([torch.zeros(1, dtype=torch.long), doclens.cumsum(0)])

    lazy_records = _LazyRecords(parts)  # one read per hit, for all fields

    def lazy_view(field: str):
        return lazy_records.view(field)

    if not with_sentences:
        return EncodedCorpus(
            ids=lazy_view("id"), texts=lazy_view("text"), vectors=vectors,
            offsets=torch.zeros((num_tokens, 2), dtype=torch.long),
            token_passage=token_passage, token_sentence=torch.full((num_tokens,), -1, dtype=torch.long),
            sentences=torch.zeros((0, 2), dtype=torch.long), sentence_passage=torch.zeros(0, dtype=torch.long),
            passage_starts=passage_starts)
    members: Dict[int, tuple] = {}
    stored_tables = all(store.sentence_tokens is not None for store, _ in parts)
    if with_offsets or not stored_tables:
        ids, texts, spans, offset_parts, base = [], [], {}, [], 0
        for (store, pids), r in zip(parts, rows):
            records = [store.record(p) for p in pids.tolist()]
            own: Dict[int, tuple] = {}
            offset_parts.append(store._offsets(pids, r, records, own))
            members.update({base + k: m for k, m in own.items()})
            ids += [rec["id"] for rec in records]
            texts += [rec["text"] for rec in records]
            spans.update({rec["id"]: tuple(rec["spans"]) for rec in records if "spans" in rec})
            base += len(pids)
        offsets = torch.cat(offset_parts)
    else:  # sentence scores need the stored token→sentence table only: records read for the hits alone
        ids, texts, spans = lazy_view("id"), lazy_view("text"), {}
        offsets = torch.zeros((num_tokens, 2), dtype=torch.long)
    counts = [store.sent_starts[pids + 1] - store.sent_starts[pids] for store, pids in parts]
    sent_rows = [_ranges(store.sent_starts[pids], c) for (store, pids), c in zip(parts, counts)]
    sent_counts = _joined_rows(counts)
    sentences = torch.from_numpy(_joined_rows([store.sentences[r] for (store, _), r in zip(parts, sent_rows)])
                                 .astype(np.int64))
    span_starts = torch.from_numpy(np.concatenate([[0], np.cumsum(sent_counts)]))
    if stored_tables and not with_offsets:
        table = _joined_rows([store.sentence_tokens[r] for (store, _), r in zip(parts, sent_rows)])
        local = torch.from_numpy(token_sentences_from_rows(table, sent_counts, doclens_np))
    else:
        local = sorted_token_segments(offsets, sentences.reshape(-1, 2), token_passage, span_starts)
    token_sentence = torch.where(local >= 0, local + span_starts[token_passage], local)
    return EncodedCorpus(
        ids=ids, texts=texts, vectors=vectors,
        offsets=offsets, token_passage=token_passage, token_sentence=token_sentence,
        sentences=sentences.reshape(-1, 2),
        sentence_passage=torch.from_numpy(np.repeat(np.arange(n), sent_counts)),
        passage_starts=passage_starts, spans=spans, pool_members=members)


def _joined_rows(arrays: List[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class _LazyRecords:
    """Passage records of the ``pids`` of each ``(store, pids)`` part, in that order, read on first access (one
    field per :meth:`view`). Item k's store and position are looked up in two arrays, not by searching the
    parts: a top 100 reads 200 items (ids, texts) — over 8 shards' parts, a view chained per part cost 1 ms."""

    def __init__(self, parts: Sequence[Tuple["Store", np.ndarray]]):
        self._stores = [store for store, _ in parts]
        self._which = np.repeat(np.arange(len(parts)), [len(pids) for _, pids in parts]).tolist()
        self._pids = (np.concatenate([pids for _, pids in parts]) if parts else np.zeros(0, dtype=np.int64)).tolist()
        self._cache: Dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self._pids)

    def get(self, k: int) -> dict:
        found = self._cache.get(k)
        if found is None:
            found = self._cache[k] = self._stores[self._which[k]].record(self._pids[k])
        return found

    def view(self, field: str) -> "_FieldView":
        return _FieldView(self, field)


class _FieldView(Sequence):
    def __init__(self, records: _LazyRecords, field: str):
        self._records, self._field = records, field

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self._records.get(k if k >= 0 else len(self) + k)[self._field]


def offsets_stored(manifest: dict) -> bool:
    """Whether an index keeps token offsets in ``tokens.bin`` (indexes written before the
    ``token_offsets`` field all did)."""
    return manifest.get("token_offsets", "stored") == "stored"


class Store:
    """Read side of one committed generation: memory-mapped arrays, lazily read passages.

    ``tokenize``: texts → their token offsets (:meth:`Encoder.passage_offsets` of the index's
    model), needed for sentence and span tables when the index does not store offsets.
    """

    def __init__(self, path: str | Path, manifest: Optional[dict] = None, verify: bool | str = "auto",
                 tokenize: Optional[Callable[[List[str]], list]] = None, verify_meta: bool | str | None = None):
        self.path = Path(path)
        self.tokenize = tokenize
        self.manifest = manifest if manifest is not None else read_manifest(self.path)
        if self.manifest["format"] != FORMAT_V2:
            raise IndexFolderError(f"{self.path}: not a compressed ({FORMAT_V2}) index")
        m, files = self.manifest, self.manifest["files"]
        self.root = store_root(self.path, m)
        self._prefix = str(m.get("store", ""))
        self._watched = list(files) + ([m["metadata"], m["metadata"] + "-wal"] if m.get("metadata") else [])
        self._seen = self._stats()  # before anything is checked: a change made while checking is seen next time
        self._damaged: Dict[str, str] = {}
        self._check_lock = threading.Lock()
        # Files the open checksums are read into memory and checked there (:meth:`_map`): a later edit of the
        # file — in place, through a shared map, racing a request — cannot change what this reader serves.
        # passages.jsonl stays mapped (a server's memory must not hold every text) and each record read is
        # checked against its CRC-32 (:meth:`record_bytes`), computed here from the checked bytes.
        self._verify = verify
        self._record_crc: Optional[np.ndarray] = None
        check_files(self.root, {n: i for n, i in files.items() if not self._copied(n)}, verify)
        check_files(self.root, {n: i for n, i in files.items() if self._copied(n)}, False)  # (their sizes)
        try:
            self.codec = read_codec(self.root, m)
            T, N = m["num_tokens"], m["num_passages"]
            self.codes = self._map("codes.bin", np.dtype(m["code_dtype"]), (T,))
            self.residuals = self._map("residuals.bin", np.uint8, (T, self.codec.bytes_per_token))
            # (a pooled index's tokens.bin holds its original tokens: the vectors' offsets and members follow)
            self.tokens = self._map(TOKENS_FILE, TOKEN_DTYPE, (int(m.get("num_original_tokens", T)),)) \
                if offsets_stored(m) else None
            self.sentence_tokens = None if offsets_stored(m) else \
                self._map(SENTENCE_TOKENS_FILE, np.int32, (m["num_sentences"], 2))
            self.pool_factor = pool_factor(m)
            self.pool_codes = self.origlens = None  # (a pooled index's: which vector each original token went to)
            if self.pool_factor != 1:
                self.pool_codes = self._map(POOL_FILE, np.uint8, (int(m["num_original_tokens"]),))
                self.origlens = np.fromfile(self.root / ORIGLENS_FILE, dtype="<i4", count=N).astype(np.int64)
                self.orig_starts = np.concatenate([[0], np.cumsum(self.origlens)])
            self.doclens = np.fromfile(self.root / "doclens.bin", dtype="<i4", count=N).astype(np.int64)
            self.sentcounts = np.fromfile(self.root / "sentcounts.bin", dtype="<i4", count=N).astype(np.int64)
            self.sentences = np.fromfile(self.root / "sentences.bin", dtype="<i4",
                                         count=2 * m["num_sentences"]).reshape(-1, 2)
            self.passage_offsets = np.fromfile(self.root / "passage_offsets.bin", dtype="<i8", count=N)
            self.ivf = self._read_ivf(m)
            tombstones = m.get("tombstones")
            self.deleted = (np.fromfile(self.root / tombstones, dtype="<i4", count=files[tombstones]["size"] // 4)
                            .astype(np.int64) if tombstones else np.zeros(0, dtype=np.int64))
        except (OSError, ValueError, KeyError) as exc:
            raise IndexFolderError(f"index {self.path} is damaged: {exc}") from None
        if len(self.deleted) and (self.deleted.min() < 0 or self.deleted.max() >= N
                                  or (np.diff(self.deleted) <= 0).any()):
            raise IndexFolderError(f"index {self.path} is damaged: its tombstones are not sorted positions")
        self.alive: Optional[np.ndarray] = None  # None: every position is live
        if len(self.deleted):
            self.alive = np.ones(N, dtype=bool)
            self.alive[self.deleted] = False
            self.alive.flags.writeable = False
        self._filter_cache: Dict[str, np.ndarray] = {}
        self.starts = np.concatenate([[0], np.cumsum(self.doclens)])
        self.sent_starts = np.concatenate([[0], np.cumsum(self.sentcounts)])
        if self.starts[-1] != m["num_tokens"] or self.sent_starts[-1] != m["num_sentences"]:
            raise IndexFolderError(f"index {self.path} is damaged: counts disagree with {MANIFEST}")
        self._text_size = int(files["passages.jsonl"]["size"])
        if self._copied("passages.jsonl"):
            self._record_crc = self._record_checksums(self._read_checked("passages.jsonl"))
        self._texts = self._map("passages.jsonl", np.uint8, (self._text_size,), copy=False)
        self.meta: Optional[MetadataDB] = None
        if m.get("metadata"):
            self._open_metadata(verify if verify_meta is None else verify_meta)

    def _read_ivf(self, m: dict) -> InvertedFile:
        if ivf_pids(m) == "derived":
            return derive_ivf(self.codes, self.doclens, m["num_centroids"])
        g = ivf_generation(m)
        offsets = np.fromfile(self.root / f"ivf-{g}.offsets.bin", dtype="<i8", count=m["num_centroids"] + 1)
        if offsets[0] != 0 or (np.diff(offsets) < 0).any():
            raise ValueError(f"ivf-{g}.offsets.bin is not ascending from 0")
        name, size = f"ivf-{g}.pids.bin", m["files"][f"ivf-{g}.pids.bin"]["size"]
        if ivf_pids(m) == "varint":
            return InvertedFile(offsets, decode_varint(self._map(name, np.uint8, (size,)), offsets, m["num_passages"]))
        if size != 4 * offsets[-1]:
            raise ValueError(f"{name} holds {size // 4} passages, its offsets {offsets[-1]}")
        return InvertedFile(offsets, self._map(name, np.int32, (size // 4,)))

    def _open_metadata(self, verify: bool | str) -> None:
        """The metadata file, checked against the manifest's digest (its rows' checksums kept for the reads)."""
        name = self.manifest["metadata"]
        try:
            self.meta = MetadataDB(self.root / name)
        except (OSError, sqlite3.Error) as exc:
            raise IndexFolderError(f"index {self.path} is damaged: {name}: {exc}") from None
        try:
            self._meta_version = self.meta.data_version()
            self.meta.verify(self.manifest, self.path, verify)
        except BaseException:
            self.close()
            raise

    # -- a running reader's check that what it serves is still what was committed ----------------

    def _stats(self) -> Dict[str, Optional[tuple]]:
        out: Dict[str, Optional[tuple]] = {}
        for name in self._watched:
            try:
                st = os.stat(self.root / name)
                out[name] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if name.endswith("-wal") and st.st_size == 0:
                    # an empty write-ahead log holds nothing: SQLite recreates it when a connection opens and
                    # removes it when the last one closes, so its inode and times change at every reopen of
                    # our own; counting that as a change re-digested the metadata at every request (issue 62)
                    out[name] = ("empty",)
            except FileNotFoundError:
                out[name] = None
        return out

    def _copied(self, name: str) -> bool:
        """Whether the open checks ``name`` as a whole (``verify``'s rule, :func:`check_files`) from the bytes
        it keeps: the arrays search reads, and passages.jsonl's per-record checksums."""
        m = self.manifest
        searched = {"codes.bin", "residuals.bin", TOKENS_FILE, SENTENCE_TOKENS_FILE, POOL_FILE, "passages.jsonl",
                    f"ivf-{ivf_generation(m)}.pids.bin"}
        if name not in m["files"] or name not in searched:
            return False
        size = self.manifest["files"][name]["size"]
        return self._verify is True or (self._verify == "auto" and size <= VERIFY_LIMIT)

    def _read_checked(self, name: str) -> np.ndarray:
        """The committed bytes of ``name``, read once and checked against the manifest's CRC-32."""
        info = self.manifest["files"][name]
        data = np.fromfile(self.root / name, dtype=np.uint8, count=int(info["size"]))
        if len(data) != info["size"] or zlib.crc32(data) != info["crc32"]:
            raise IndexFolderError(f"index {self.path} is damaged: {self._prefix}{name} does not match its checksum")
        return data

    def _record_checksums(self, data: np.ndarray) -> np.ndarray:
        """CRC-32 of every stored passage record (its JSON line), from the checked bytes of passages.jsonl
        (~1 µs a record at open: 33,591 records in ~40 ms)."""
        bounds = np.append(self.passage_offsets, len(data)).tolist()
        if any(b < a for a, b in zip(bounds, bounds[1:])) or (bounds and bounds[-1] > len(data)):
            raise IndexFolderError(f"index {self.path} is damaged: passage_offsets.bin does not fit passages.jsonl")
        return np.fromiter((zlib.crc32(data[a:b]) for a, b in zip(bounds, bounds[1:])), dtype=np.uint32,
                           count=len(self.passage_offsets))

    def _damage(self, name: str, problem: str) -> None:
        """Refuse to go on serving ``name`` (until :meth:`check_unchanged` finds it whole again)."""
        with self._check_lock:
            self._damaged[name] = problem
        raise IndexDamagedError(self.path, self._prefix + name, problem)

    def check_unchanged(self) -> None:
        """Refuse (:class:`IndexDamagedError` naming the file) to go on serving this generation once a
        committed file no longer holds what its manifest committed.

        Cost: one ``stat`` per file and SQLite's ``data_version``; a file whose stat changed since it was last checked has its committed bytes
        checksummed again (CRC-32, ~1 GB/s) and a written metadata file is digested again (its rows).
        A writer's appends change the stats too: they are checked and pass (committed bytes and rows
        never change). A damaged file stays refused until it is checked again and passes."""
        with self._check_lock:
            stats = self._stats()
            changed = [name for name in self._watched if stats[name] != self._seen.get(name)]
            # a damaged file is checked again at every call, changed stat or not: bytes edited through a
            # shared map, and put back the same way, change neither mtime nor ctime
            changed += [name for name in self._damaged if name not in changed]
            version = None
            if self.meta is not None:
                version = self.meta.data_version()
                if version != self._meta_version and self.manifest["metadata"] not in changed:
                    changed.append(self.manifest["metadata"])
            metadata = self.manifest.get("metadata")
            for name in dict.fromkeys(metadata if metadata and n.startswith(metadata) else n for n in changed):
                self._damaged.pop(name, None)
                try:
                    if name in self.manifest["files"]:
                        check_files(self.root, {name: self.manifest["files"][name]}, verify=True)
                    elif self.meta is not None:
                        # a fresh connection: the open one may keep pages in its cache, edited (a restored
                        # file stays refused) or not (an edited one passes)
                        self.meta.reopen()
                        self.meta.verify(self.manifest, self.path, verify=True)
                except IndexFolderError as exc:
                    said = str(exc).split(name, 1)[-1].lstrip(":").strip() if name in str(exc) else ""
                    self._damaged[name] = said or "does not match what was committed"
                except (OSError, sqlite3.Error) as exc:  # gone (a compaction's new store) or unreadable
                    self._damaged[name] = "is missing" if isinstance(exc, FileNotFoundError) else \
                        f"cannot be read ({type(exc).__name__})"
            self._seen = stats
            if version is not None:
                self._meta_version = version
            if self._damaged:
                name = sorted(self._damaged)[0]
                raise IndexDamagedError(self.path, self._prefix + name, self._damaged[name])

    def close(self) -> None:
        """Close the metadata connection (memory maps go with the object)."""
        if self.meta is not None:
            self.meta.close()
            self.meta = None

    def _map(self, name: str, dtype, shape, copy: bool = True) -> np.ndarray:
        """File ``name`` as an array: the bytes the open checked (:meth:`_copied`), else a memory map."""
        if int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype=dtype)
        if copy and self._copied(name):
            dtype = np.dtype(dtype)
            data = self._read_checked(name)[:int(np.prod(shape)) * dtype.itemsize]
            array = data.view(dtype).reshape(shape)
            array.flags.writeable = False
            return array
        # A plain ndarray view of the mapping: np.memmap's own __getitem__ costs ~25 µs a slice,
        # a third of a passage record's read.
        return np.memmap(self.root / name, dtype=dtype, mode="r", shape=shape).view(np.ndarray)

    def __len__(self) -> int:
        """Stored positions, deleted ones included (:attr:`num_live` counts the others)."""
        return int(self.manifest["num_passages"])

    @property
    def num_live(self) -> int:
        return len(self) - len(self.deleted)

    def live_positions(self) -> np.ndarray:
        return np.arange(len(self)) if self.alive is None else np.flatnonzero(self.alive)

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    def record(self, p: int) -> dict:
        """``{"id", "text", "spans"?}`` of passage ``p``, read from the memory-mapped passage file
        (nothing is cached: a long-running server's memory does not grow with what it served)."""
        return json.loads(self.record_bytes(p))

    def record_bytes(self, p: int) -> bytes:
        """The stored JSON line of passage position ``p``."""
        start = int(self.passage_offsets[p])
        end = int(self.passage_offsets[p + 1]) if p + 1 < len(self) else self._text_size
        raw = self._texts[start:end].tobytes()
        # the bytes returned are the bytes checked: no edit can land between the check and the read
        if self._record_crc is not None and zlib.crc32(raw) != int(self._record_crc[p]):
            self._damage("passages.jsonl", f"does not match its checksum (the record at position {p})")
        return raw

    def ids(self) -> List[str]:
        """The id of every stored position (deleted ones included), from the mapped passage file."""
        return [json.loads(self.record_bytes(p))["id"] for p in range(len(self))]

    def live_ids(self) -> Dict[str, int]:
        """id → position of every live passage."""
        if self.meta is not None:
            rows = self.meta._query("SELECT pos, id FROM passages WHERE pos < ?", (len(self),))
            pairs = [(pid, pos) for pos, pid in rows]
        else:
            pairs = [(pid, pos) for pos, pid in enumerate(self.ids())]
        alive = self.alive
        return {pid: pos for pid, pos in pairs if alive is None or alive[pos]}

    def position_of(self, ids: Sequence[str]) -> Dict[str, int]:
        """Live position of each of ``ids`` that the index holds (absent ids are left out)."""
        if self.meta is None:
            live = self.live_ids()
            return {pid: live[pid] for pid in ids if pid in live}
        out = {}
        for pid, positions in self.meta.positions_of(ids, len(self)).items():
            for pos in reversed(positions):  # an upsert's newest copy is the live one
                if self.alive is None or self.alive[pos]:
                    out[pid] = pos
                    break
        return out

    def damaged_lookup(self, passage_id: str) -> None:
        """Raise: the id → position lookup gave a position whose (checked) record holds another id."""
        name = self.manifest.get("metadata") or "passages.jsonl"
        self._damage(name, f"does not match its digest (id {passage_id[:60]!r} leads to another passage)")

    def metadata(self, p: int) -> dict:
        from .metadata import RowDamaged

        if self.meta is None:
            return {}
        try:
            return self.meta.metadata(p)
        except RowDamaged as exc:
            self._damage(self.manifest["metadata"], f"does not match its digest ({exc})")

    def metadata_by_id(self, ids: Sequence[str]) -> Dict[str, dict]:
        """The metadata of the live passages among ``ids`` (``{}`` for one without), in one query; a row
        whose check fails is damage, as in :meth:`Index.get`."""
        from .metadata import RowDamaged

        if self.meta is None:
            return {pid: {} for pid in self.position_of(ids)}
        try:
            return self.meta.checked_metadata_of_ids(ids, len(self), self.alive)
        except RowDamaged as exc:
            self._damage(self.manifest["metadata"], f"does not match its digest ({exc})")

    def allowed(self, spec) -> Optional[np.ndarray]:
        """Boolean mask of the live positions a filter admits (None: every position, nothing deleted).

        Masks are cached per filter (its canonical JSON) for this generation's lifetime: a service
        sees the same few filters (a tenant, a source) again and again, and a generation never changes.
        The returned array is read-only."""
        from .metadata import is_empty, parse_filter

        if is_empty(spec):
            return self.alive
        tree = parse_filter(spec)  # its bounds first: a 2,000-deep filter is a FilterError, not a RecursionError
        key = repr(tree)
        mask = self._filter_cache.get(key)
        if mask is None:
            mask = self.filter_mask(tree)
            if len(self._filter_cache) >= FILTER_CACHE:
                self._filter_cache.pop(next(iter(self._filter_cache)))
            self._filter_cache[key] = mask
        return mask

    def filter_mask(self, spec) -> np.ndarray:
        """:meth:`allowed`, computed (no cache); ``spec``: a filter or its parsed tree."""
        from .metadata import RowDamaged, matches, parse_filter

        tree = spec if isinstance(spec, tuple) else parse_filter(spec)
        if self.meta is None:  # an index written before metadata: every passage has none
            mask = np.full(len(self), matches({}, tree), dtype=bool)
        else:
            mask = np.zeros(len(self), dtype=bool)
            try:
                mask[self.meta.checked_positions(tree, len(self))] = True
            except RowDamaged as exc:
                self._damage(self.manifest["metadata"], f"does not match its digest ({exc})")
        if self.alive is not None:
            mask &= self.alive
        mask.flags.writeable = False
        return mask

    def token_rows(self, pids: np.ndarray) -> np.ndarray:
        """Token positions of passages ``pids``, concatenated in that order."""
        pids = np.asarray(pids, dtype=np.int64)
        return _ranges(self.starts[pids], self.doclens[pids])

    def corpus(self, pids: Sequence[int], with_sentences: bool = True, with_offsets: bool = True,
               lazy: bool = False) -> EncodedCorpus:
        """Decompress passages ``pids`` into an :class:`EncodedCorpus` (in that order) for exact scoring.

        ``with_sentences=False`` (passage searches) skips the sentence tables and reads a passage's
        record (id, text) only when a caller asks for it — for the few hits, not every survivor.
        ``with_offsets=False`` (sentence searches) leaves every token's offsets at (0, 0) instead of
        recomputing them: sentence scores need only the token→sentence table; where that table is
        stored the records, too, are read for the hits alone (and stored spans are left out). Spans
        and explanations need offsets (the default). A passage-only corpus has neither.
        ``lazy``: vectors that decompress as exact scoring reads them (:class:`CompressedVectors`)
        instead of one float32 tensor.
        """
        return gather([(self, pids)], with_sentences=with_sentences, with_offsets=with_offsets, lazy=lazy)

    def _offsets(self, pids: np.ndarray, rows: np.ndarray, records: List[dict], members: Optional[dict] = None):
        """``[n, 2]`` character offsets of the tokens of ``pids`` (rows ``rows``): stored, or recomputed
        (a pooled index's: of its vectors, and ``members`` gets each passage's original tokens)."""
        import torch

        def stored(token_rows):
            tokens = self.tokens[token_rows]
            return torch.from_numpy(np.stack([tokens["start"], tokens["start"] + tokens["length"]], axis=1)
                                    .astype(np.int64))

        if self.tokens is not None and self.pool_codes is None:
            return stored(rows)
        if self.tokens is not None:
            parts = [stored(np.arange(self.orig_starts[p], self.orig_starts[p + 1])) for p in pids.tolist()]
        elif self.tokenize is None:
            raise IndexFolderError(f"index {self.path} recomputes token offsets with its model's tokenizer: "
                                   "open it with the model (Index(path, model=…))")
        else:
            parts = self.tokenize([r["text"] for r in records])
        for k, (p, r, part) in enumerate(zip(pids.tolist(), records, parts)):
            tokens = self.doclens[p] if self.pool_codes is None else self.origlens[p]
            if len(part) != tokens:
                raise IndexFolderError(f"index {self.path}: passage {r['id']!r} has {tokens} token "
                                       f"vectors{'' if self.pool_codes is None else ' before pooling'} but the "
                                       f"model's tokenizer gives {len(part)} tokens "
                                       "(a damaged index, or another model's tokenizer)")
            if self.pool_codes is not None:
                assignment = decode_assignment(self.pool_codes[self.orig_starts[p]:self.orig_starts[p + 1]])
                if len(assignment) and (assignment.min() < 0 or assignment.max() + 1 != self.doclens[p]):
                    raise IndexFolderError(f"index {self.path} is damaged: {POOL_FILE} of passage {r['id']!r} "
                                           f"does not give its {self.doclens[p]} vectors")
                parts[k] = pooled_offsets(part, assignment)
                if members is not None:
                    members[k] = (part, assignment)
        return torch.cat(parts) if parts else torch.zeros((0, 2), dtype=torch.long)

    def bytes(self, include_text: bool = False) -> int:
        """Committed bytes of the folder (manifest included; passage text optional)."""
        text = {"passages.jsonl"}
        total = (self.path / MANIFEST).stat().st_size
        return total + sum(info["size"] for name, info in self.manifest["files"].items()
                           if include_text or name not in text)


def verify_crc(path: str | Path) -> None:
    """Checksum every file of a compressed index (also the large ones ``open`` only sizes), and run
    SQLite's integrity check on its metadata file."""
    manifest = read_manifest(path)
    if manifest["format"] != FORMAT_V2:
        return
    root = store_root(Path(path), manifest)
    check_files(root, manifest.get("files", {}), verify=True)
    if manifest.get("metadata"):
        try:
            db = MetadataDB(root / manifest["metadata"])
            try:
                db.verify(manifest, path, verify=True)
                db.check()
                if db.count() < manifest["num_passages"]:
                    raise sqlite3.DatabaseError(f"{db.count()} rows for {manifest['num_passages']} passages")
            finally:
                db.close()
        except (OSError, sqlite3.Error) as exc:
            raise IndexFolderError(f"index {path} is damaged: {manifest['metadata']}: {exc}") from None


__all__ = ["Store", "offsets_stored", "pool_factor", "train_codec", "verify_crc", "crc32_file", "write_store"]
