"""Why a passage ranked: token-level matches and every sentence's scores, from one encoding.

The numbers are the ranker's own: one similarity matrix between the query's token vectors
and the passage's (:func:`agrame.scoring.similarity`), the passage score by
:func:`agrame.scoring.maxsim`, the sentence scores by :func:`agrame.scoring.segment_maxsim`
and :func:`agrame.scoring.combined_score`. What is added is only *where* each maximum
lies (:func:`agrame.scoring.token_matches`), and rendering: ANSI for a terminal, plain
markers for a pipe, a self-contained HTML page.
"""

from __future__ import annotations

import html
import json
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import scoring
from .corpus import EncodedCorpus


class QueryToken(NamedTuple):
    """One scored query token and the passage token it matched (argmax of its similarity row)."""

    token: str  # wordpiece (special tokens and markers as the tokenizer names them)
    start: int  # characters in the query; start == end for special tokens
    end: int
    passage_token: int  # index into Explanation.passage_tokens
    similarity: float


class PassageToken(NamedTuple):
    """One passage token: its characters and its best similarity to any query token."""

    start: int  # start == end for [CLS], [D], [SEP]
    end: int
    similarity: float
    query_token: int  # index into Explanation.query_tokens of the most similar query token
    matched: bool  # some query token's maximum lies here (it adds to S(q,p))


class SentenceScore(NamedTuple):
    start: int
    end: int
    span_score: float  # S'(q,s)
    passage_score: float  # S(q,p)
    score: float  # S'(q,s) + α·S(q,p)


class Explanation(NamedTuple):
    query: str
    passage_id: str
    text: str
    passage_score: float
    alpha: float
    query_tokens: List[QueryToken]
    passage_tokens: List[PassageToken]
    sentences: List[SentenceScore]  # in passage order
    best_sentence: Optional[int]  # index into sentences

    def to_json(self) -> dict:
        return {"query": self.query, "passage_id": self.passage_id, "text": self.text,
                "passage_score": self.passage_score, "alpha": self.alpha,
                "query_tokens": [t._asdict() for t in self.query_tokens],
                "passage_tokens": [t._asdict() for t in self.passage_tokens],
                "sentences": [s._asdict() for s in self.sentences], "best_sentence": self.best_sentence}


def explain_passage(query: str, query_tokens: Sequence[Tuple[str, int, int]], q: torch.Tensor,
                    s: Optional[torch.Tensor], corpus: EncodedCorpus, p: int, alpha: float) -> Explanation:
    """Explain passage ``p`` of ``corpus`` for query vectors ``q`` (``[Q]``) and ``s`` (sub-unit
    query; ``s is q`` when shared). ``query_tokens``: (token, start, end) of each row of ``q``."""
    sl = corpus.passage_tokens(p)
    vectors = corpus.vectors[sl]
    vectors = torch.as_tensor(vectors, dtype=torch.float32) if not isinstance(vectors, torch.Tensor) else vectors.float()
    sim = scoring.similarity(q.float(), vectors)  # [Lq, n]
    passage_score = float(scoring.maxsim(sim))
    q_best, q_arg = scoring.token_matches(sim)  # per query token: best passage token
    p_best, p_arg = scoring.token_matches(sim.transpose(0, 1))  # per passage token: best query token
    matched = torch.zeros(sim.shape[1], dtype=torch.bool)
    matched[q_arg] = True
    offsets = corpus.offsets[sl]
    s_sim = sim if s is None or s is q else scoring.similarity(s.float(), vectors)
    tok_sent = corpus.token_sentence[sl]
    owned = (corpus.sentence_passage == p).nonzero().flatten()
    sentences: List[SentenceScore] = []
    best = None
    if owned.numel():
        first = int(owned[0])
        local = torch.where(tok_sent >= 0, tok_sent - first, tok_sent)
        span_scores = scoring.segment_maxsim(s_sim, local, owned.numel())
        combined = scoring.combined_score(span_scores, torch.tensor(passage_score), alpha)
        for k in range(owned.numel()):
            start, end = (int(x) for x in corpus.sentences[first + k])
            sentences.append(SentenceScore(start, end, float(span_scores[k]), passage_score, float(combined[k])))
        finite = torch.isfinite(combined)
        if finite.any():
            best = int(torch.where(finite, combined, torch.full_like(combined, float("-inf"))).argmax())
    return Explanation(
        query=query, passage_id=corpus.ids[p], text=corpus.texts[p], passage_score=passage_score, alpha=alpha,
        query_tokens=[QueryToken(tok, a, b, int(j), float(v))
                      for (tok, a, b), j, v in zip(query_tokens, q_arg.tolist(), q_best.tolist())],
        passage_tokens=[PassageToken(int(a), int(b), float(v), int(i), bool(m))
                        for (a, b), v, i, m in zip(offsets.tolist(), p_best.tolist(), p_arg.tolist(), matched.tolist())],
        sentences=sentences, best_sentence=best)


# -- rendering -----------------------------------------------------------------------------

def _segments(e: Explanation):
    """The passage cut into pieces ``(start, end, token or None, heat 0–1)`` covering all its text,
    with a cut at the best sentence's borders (a token crossing a border stays whole and goes
    inside), and ``inside`` telling whether a piece lies in the best sentence."""
    tokens = sorted((t for t in e.passage_tokens if t.end > t.start), key=lambda t: t.start)
    top = max((t.similarity for t in tokens), default=1.0)
    low = min((t.similarity for t in tokens), default=0.0)
    scale = (top - low) or 1.0
    best = e.sentences[e.best_sentence] if e.best_sentence is not None else None
    pieces, pos = [], 0
    for t in tokens:
        if t.start < pos:
            continue
        if t.start > pos:
            pieces.append((pos, t.start, None, 0.0))
        pieces.append((t.start, t.end, t, (t.similarity - low) / scale))
        pos = t.end
    if pos < len(e.text):
        pieces.append((pos, len(e.text), None, 0.0))
    out = []
    for start, end, t, h in pieces:
        cuts = [start, end]
        if best is not None and t is None:
            cuts = sorted({start, end, *(c for c in (best.start, best.end) if start < c < end)})
        for a, b in zip(cuts, cuts[1:]):
            inside = best is not None and (a < best.end and b > best.start)
            out.append((a, b, t, h, inside))
    return out


def render_text(e: Explanation, color: bool) -> str:
    """The passage with matched tokens and the best sentence marked, then the score tables.

    With ``color``: ANSI (matched tokens bold on a heat background, best sentence underlined);
    without: ``[token]`` for matched tokens and ``»…«`` around the best sentence.
    """
    text = e.text
    out, was_inside = [], False
    for start, end, t, h, inside in _segments(e):
        if inside != was_inside:
            out.append(("\x1b[4m" if inside else "\x1b[24m") if color else ("»" if inside else "«"))
            was_inside = inside
        word = text[start:end]
        if t is None:
            out.append(word)
        elif color:
            shade = 232 + int(round(h * 12))  # grey ramp of the 256-colour palette
            out.append(f"\x1b[48;5;{shade}m" + ("\x1b[1;33m" if t.matched else "") + word + "\x1b[22;39;49m")
        else:
            out.append(f"[{word}]" if t.matched else word)
    if was_inside:
        out.append("\x1b[24m" if color else "«")
    lines = [f"passage {e.passage_id}: S(q,p) = {e.passage_score:.3f}", "", "".join(out), ""]
    lines.append("query token → passage token (similarity)")
    for qt in e.query_tokens:
        pt = e.passage_tokens[qt.passage_token]
        matched = text[pt.start:pt.end] if pt.end > pt.start else "<special>"
        lines.append(f"  {qt.token:<16} → {matched:<20} {qt.similarity:.3f}")
    lines += ["", f"sentences: S'(q,s) + {e.alpha:g}·S(q,p)"]
    for k, sent in enumerate(e.sentences):
        mark = "*" if k == e.best_sentence else " "
        snippet = " ".join(text[sent.start:sent.end].split())
        snippet = snippet if len(snippet) <= 70 else snippet[:69] + "…"
        lines.append(f" {mark} {sent.score:8.3f} = {sent.span_score:7.3f} + {e.alpha:g}·{sent.passage_score:.3f}  {snippet}")
    return "\n".join(lines) + "\n"


def render_html(explanations: Sequence[Explanation]) -> str:
    """A self-contained page (inline CSS, no script): token heat map, matched tokens, best sentence."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>AGRaME explanation</title><style>",
             "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;line-height:1.7}",
             ".tok{border-radius:3px;padding:0 1px}.m{font-weight:bold;border-bottom:2px solid #b45309}",
             ".best{outline:2px solid #2563eb;border-radius:4px}table{border-collapse:collapse}",
             "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}",
             "</style></head><body>"]
    for e in explanations:
        best = e.sentences[e.best_sentence] if e.best_sentence is not None else None
        parts.append(f"<h2>{html.escape(e.passage_id)}</h2><p>Query: <b>{html.escape(e.query)}</b> — "
                     f"S(q,p) = {e.passage_score:.3f}</p><p class='passage' data-passage='{html.escape(e.passage_id)}'>")
        text = e.text
        was_inside = False
        for start, end, t, h, inside in _segments(e):
            if inside != was_inside:
                parts.append(f"<span class='best' data-start='{best.start}' data-end='{best.end}'>" if inside
                              else "</span>")
                was_inside = inside
            word = html.escape(text[start:end])
            if t is None:
                parts.append(word)
            else:
                cls = "tok m" if t.matched else "tok"
                parts.append(f"<span class='{cls}' style='background:rgba(249,115,22,{0.08 + 0.6 * h:.2f})' "
                             f"title='{t.similarity:.3f}'>{word}</span>")
        parts.append(("</span>" if was_inside else "") + "</p>")
        parts.append("<table><tr><th>query token</th><th>matched passage token</th><th>similarity</th></tr>")
        for qt in e.query_tokens:
            pt = e.passage_tokens[qt.passage_token]
            word = text[pt.start:pt.end] if pt.end > pt.start else "(special)"
            parts.append(f"<tr><td>{html.escape(qt.token)}</td><td>{html.escape(word)}</td>"
                         f"<td>{qt.similarity:.3f}</td></tr>")
        parts.append("</table><table><tr><th></th><th>score</th><th>S'(q,s)</th><th>sentence</th></tr>")
        for k, sent in enumerate(e.sentences):
            parts.append(f"<tr><td>{'★' if k == e.best_sentence else ''}</td><td>{sent.score:.3f}</td>"
                         f"<td>{sent.span_score:.3f}</td><td>{html.escape(text[sent.start:sent.end])}</td></tr>")
        parts.append("</table>")
    data = json.dumps([e.to_json() for e in explanations]).replace("</", "<\\/")
    parts.append(f"<script type='application/json' id='data'>{data}</script></body></html>")
    return "".join(parts)
