"""PropCite: attribute each proposition of a generated answer to the passages that support it."""

from .citer import MODES, CitedAnswer, Citer, PropositionCitation, SentenceCitation, cite
from .propositions import align_propositions, tag_propositions

__all__ = ["cite", "Citer", "CitedAnswer", "SentenceCitation", "PropositionCitation", "MODES",
           "tag_propositions", "align_propositions"]
