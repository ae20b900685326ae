"""AGRaME: any-granularity ranking with one multi-vector passage encoding.

>>> from agrame import Ranker
>>> Ranker().rank("What causes coral bleaching?", passages, granularity="sentence")
"""

from .corpus import EncodedCorpus, Passage
from .encoder import Encoder, EncoderSettings, ModelError
from .loading import load_encoder
from .ranker import GRANULARITIES, Ranker, ScoredSpan
from .spans import span_token_mask, split_sentences

__version__ = "0.1.0"

__all__ = [
    "GRANULARITIES",
    "EncodedCorpus",
    "Encoder",
    "EncoderSettings",
    "ModelError",
    "Passage",
    "Ranker",
    "ScoredSpan",
    "load_encoder",
    "span_token_mask",
    "split_sentences",
]
