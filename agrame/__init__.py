"""AGRaME: any-granularity ranking with one multi-vector passage encoding.

>>> from agrame import Ranker
>>> Ranker().rank("What causes coral bleaching?", passages, granularity="sentence")
"""

import os as _os
import sys as _sys

# OpenMP threads that finish their share of a parallel region spin, waiting for the next one (libgomp's
# OMP_WAIT_POLICY=ACTIVE behaviour by default). A search is many small regions: with another job on the machine
# the spinning thread takes the core the working one needs, and passage top 100 ran 2.5-5x slower on 2 loaded
# cores than with the threads sleeping instead (issue 64; benchmarks.openmp_wait measures the settings idle and
# beside a second job: benchmarks/README.md, "OpenMP's wait policy"). libgomp
# reads the variable once, when torch loads it: this works when agrame is imported before torch, and a value
# the user set is kept.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .corpus import EncodedCorpus, Passage  # noqa: E402
from .encoder import Encoder, EncoderSettings, ModelError  # noqa: E402
from .loading import load_encoder  # noqa: E402
from .ranker import GRANULARITIES, Ranker, ScoredSpan  # noqa: E402
from .spans import span_token_mask, split_sentences  # noqa: E402

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
