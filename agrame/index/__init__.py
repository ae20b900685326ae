"""On-disk indexes: build, open, search.

``agrame-index/2`` (default) stores each token as a centroid id plus a residual quantised to
``nbits`` per dimension (:mod:`.codec`), an inverted file centroid → passages (:mod:`.ivf`),
and searches in PLAID's stages (:mod:`.search`); :mod:`.store` writes and reads the files,
:mod:`.format` holds the manifest, integrity checks and model agreement. ``agrame-index/1``
(:mod:`.v1`, float16 vectors scanned exhaustively) still opens and searches.

>>> from agrame.index import build_index, Index
>>> build_index(encoder, passages, "my-index")            # nbits=2
>>> Index("my-index").search("coral bleaching", granularity="sentence", top_k=5)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ..corpus import Passage, PassageLike, as_passages
from ..encoder import Encoder
from .codec import ResidualCodec, num_centroids
from .base import BaseIndex
from .format import IndexFolderError, NoSpaceError, check_model, index_model_name, read_manifest
from .lock import IndexLockedError
from .metadata import FilterError, MetadataError
from .search import Index, SearchSettings
from .store import Store, verify_crc
from .writer import IndexWriter, PoolFactorError, UnknownIdsError, add_passages, build_compressed

#: Format written by :func:`build_index` unless told otherwise.
DEFAULT_FORMAT = 2


def build_index(encoder: Encoder, passages: Sequence[PassageLike], path: str | Path, *, format: int = DEFAULT_FORMAT,
                nbits=None, batch_size: int = 16, chunk_passages: int = 1024, overwrite: bool = False,
                progress: bool = True, sentences: Optional[Sequence] = None,
                codec: Optional[ResidualCodec] = None, lock_timeout: float = 0.0, pool_factor=None) -> Path:
    """Encode ``passages`` into an index folder at ``path``, atomically: a new folder under a temporary
    name renamed into place, or (``overwrite``) an existing index replaced as a new generation.

    ``format=2`` compresses: ``nbits`` bits a dimension of each token's residual (1, 2, 4, 8) or a product
    quantizer of it, ``"pqMxB"`` (``M`` sub-vectors of ``B`` bits, e.g. ``"pq16x6"``: 12 bytes a 128-d token),
    or a residual (additive) quantizer, ``"rqMxB"`` (``M`` codebooks of whole codewords, e.g. ``"rq14x8"``);
    None: the model's own (its settings' ``residuals``), else 2 bits. ``format=1`` writes float16 vectors.
    ``pool_factor`` (format 2): keep about one vector per ``pool_factor`` tokens, pooled within each
    sentence (:mod:`agrame.pooling`); 1 keeps one per token; None: the model's own (its settings'
    ``pool_factor``: the shipped default model's is chosen by ``benchmarks.index_search pooling``).
    ``passages``: :class:`Passage` objects or anything :meth:`Ranker.encode` takes (texts, ``(id, text)``).
    """
    passages = as_passages(passages)
    if pool_factor not in (None, 1) and format != 2:
        raise ValueError("pool_factor needs a compressed index (format=2)")
    if format == 1:
        from .v1 import build_index as build_v1
        return build_v1(encoder, passages, path, batch_size=batch_size, chunk_passages=chunk_passages,
                        overwrite=overwrite, progress=progress, sentences=sentences)
    if format != 2:
        raise ValueError(f"unknown index format {format}; choose 1 or 2")

    return build_compressed(encoder, passages, path, nbits=nbits, batch_size=batch_size,
                            chunk_passages=chunk_passages, overwrite=overwrite, progress=progress,
                            sentences=sentences, codec=codec, lock_timeout=lock_timeout, pool_factor=pool_factor)


__all__ = ["BaseIndex", "FilterError", "Index", "IndexFolderError", "IndexLockedError", "IndexWriter", "MetadataError",
           "NoSpaceError",
           "PoolFactorError", "ResidualCodec", "SearchSettings", "Store", "UnknownIdsError", "add_passages", "build_index", "check_model",
           "index_model_name", "num_centroids", "read_manifest", "verify_crc"]
