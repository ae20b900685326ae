"""The multi-vector student: AGRaME's multi-granular distillation (§3.3) and its ablations.

    python -m training.student --data runs/train/labels.jsonl --out runs/students/agrame \\
        --sentence-marker "Q'" --weighting softmax --layers 6 --dim 128 --steps 120 --batch-size 8 --lr 1e-4

(squad-a1's recipe, training/reproduce.sh; a teacher's distill.jsonl is read alike)

- Passage scores S(q,p) use the ``[Q]`` query; sentence scores S'(q,s) use the query with
  ``--sentence-marker`` (``Q'``: AGRaME; ``Q``: ablation A3), masked MaxSim over the
  passage's own token vectors (one encoding of the passage serves both).
- Loss: :class:`training.losses.MultiGranularKLLoss`; ``--sentence-weight 0`` trains the
  passage-loss-only ColBERT baseline.
- Tuned: the top ``--layers`` transformer layers, the projection (initialised from the
  principal directions of MiniLM token vectors, so training starts from a projection that
  keeps similarities instead of a random one) and the ``[Q]``/``[Q']`` embedding rows; the
  rest stays MiniLM, which keeps the shipped delta small and a CPU step cheap.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from agrame.encoder import DEFAULT_MARKERS, Encoder, EncoderSettings
from agrame.backbones import E5_SMALL, ZERO_SHOT, e5_zero_shot_settings
from agrame.loading import load_encoder
from agrame.spans import token_segments

from . import precision
from .losses import MultiGranularKLLoss


def student_encoder(dim: Optional[int], query_augmentation: bool, doc_maxlen: int,
                    query_marker: Optional[str] = DEFAULT_MARKERS["Q"], base: str = ZERO_SHOT) -> Encoder:
    """MiniLM with AGRaME markers and (optionally) a new projection, before training.

    ``query_marker`` is the token of the passage queries' marker [Q]; None encodes them as
    zero-shot MiniLM does (no marker), so that the start of a mix ranks passages exactly as
    zero-shot: an untrained [Q] alone cost 2 points of passage P@1 on the NQ guard set
    (training/results/README.md, the 384-d candidate's λ = 0).

    ``base`` ``e5-small``: multilingual-e5-small (issue 30) as e5 is used — its ``query:`` /
    ``passage:`` prefixes and no markers (its SentencePiece vocabulary has no spare rows to learn
    [Q]/[Q'] in), so passages and sentences share one query encoding."""
    if base == E5_SMALL:
        e5 = load_encoder(E5_SMALL)
        settings = dataclasses.replace(e5_zero_shot_settings(), dim=dim or None, doc_maxlen=doc_maxlen,
                                       query_augmentation=query_augmentation)
        projection = nn.Linear(e5.dim, dim, bias=False) if dim else None
        return Encoder(e5.backbone, e5.tokenizer, settings, projection, source="agrame-e5-student")
    if base != ZERO_SHOT:
        raise SystemExit(f"error: unknown base {base!r}; choose {ZERO_SHOT} or {E5_SMALL}")
    base_encoder = load_encoder(ZERO_SHOT)  # never the shipped default: training starts from MiniLM
    markers = {**DEFAULT_MARKERS, "Q": query_marker}
    settings = EncoderSettings(dim=dim or None, doc_maxlen=doc_maxlen, markers=markers,
                               span_query_marker="Q'", query_augmentation=query_augmentation)
    projection = nn.Linear(base_encoder.dim, dim, bias=False) if dim else None
    return Encoder(base_encoder.backbone, base_encoder.tokenizer, settings, projection, source="agrame-student")


@torch.no_grad()
def init_projection(encoder: Encoder, texts: Sequence[str], batch_size: int = 16) -> None:
    """Projection ← the top ``dim`` right singular vectors of MiniLM token vectors (uncentred:
    dot products, not variances, are what MaxSim uses)."""
    if encoder.projection is None:
        return
    rows = [encoder.passage_inputs(t)[0] for t in texts]
    hidden = []
    for b in range(0, len(rows), batch_size):
        batch = rows[b:b + batch_size]
        ids, mask = _pad(batch, encoder.tokenizer.pad_token_id)
        h = encoder.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden.append(h[mask.bool()])
    matrix = torch.cat(hidden)
    _, _, v = torch.linalg.svd(matrix, full_matrices=False)
    encoder.projection.weight.copy_(v[: encoder.projection.out_features])


def start_from(student: Encoder, init: Encoder) -> None:
    """Copy ``init``'s backbone and projection into ``student`` (its settings and markers stay)."""
    if (init.projection is None) != (student.projection is None) or (
            init.projection is not None and init.projection.weight.shape != student.projection.weight.shape):
        raise SystemExit(f"error: --init-model {init.source} has a {init.dim}-d projection; the student wants "
                         f"{student.dim}-d (--dim)")
    student.backbone.load_state_dict(init.backbone.state_dict())
    if init.projection is not None:
        with torch.no_grad():
            student.projection.weight.copy_(init.projection.weight)


def read_mixture(specs: Sequence[str]) -> List[dict]:
    """Records of every ``FILE`` or ``FILE@N`` (N copies), in the given order (the loop shuffles)."""
    from .records import read

    examples: List[dict] = []
    for spec in specs:
        path, _, times = spec.partition("@")
        if times and not (times.isdigit() and int(times) > 0):
            raise SystemExit(f"error: --data {spec}: expected FILE or FILE@N with N ≥ 1")
        records = read(path)
        examples += records * (int(times) if times else 1)
    sizes = {len(r["passages"]) for r in examples}
    if len(sizes) > 1:
        raise SystemExit(f"error: --data files mix {sorted(sizes)} passages per question; a batch needs one count "
                         "(make them with the same --negatives)")
    return examples


def _pad(rows: Sequence[Sequence[int]], pad: int) -> Tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def trainable_parameters(encoder: Encoder, layers: int) -> List[nn.Parameter]:
    """Freeze everything but the top ``layers`` layers, the projection and the query-marker rows."""
    for p in encoder.parameters():
        p.requires_grad_(False)
    params: List[nn.Parameter] = []
    blocks = encoder.backbone.encoder.layer
    for block in list(blocks)[len(blocks) - layers:] if layers else []:
        for p in block.parameters():
            p.requires_grad_(True)
            params.append(p)
    if encoder.projection is not None:
        encoder.projection.weight.requires_grad_(True)
        params.append(encoder.projection.weight)
    rows = sorted({encoder.marker_id(m) for m in ("Q", "Q'") if encoder.marker_id(m) is not None})
    if rows:
        emb = encoder.backbone.embeddings.word_embeddings.weight
        emb.requires_grad_(True)
        keep = torch.zeros(emb.shape[0], 1, device=emb.device)
        keep[rows] = 1.0
        # only the marker rows learn; the mask follows the gradient's device (a GPU refuses a CPU mask,
        # and the encoder may move after this is called)
        emb.register_hook(lambda g: g * (keep if keep.device == g.device else keep.to(g.device)))
        emb._no_decay = True  # weight decay would shrink every other row
        params.append(emb)
    return params


def set_attention_dropout(encoder: Encoder, p: float) -> int:
    """Set the attention-probability dropout of every self-attention block to ``p``; returns how many were set.

    Why: on a CPU, dropout on the ``[heads, n, n]`` attention probabilities costs more than the rest of the
    step (issue 60's profile: torch's CPU ``scaled_dot_product_attention`` with ``dropout_p > 0`` leaves its fused
    kernel and draws one random number per probability, 4.9 s of a 7.9 s forward of 64 SciFact passages).
    Hidden-state dropout (the regulariser fine-tuning leans on) is left as the model has it."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), not {p}")
    count = 0
    for module in encoder.backbone.modules():
        if type(module).__name__.endswith("SelfAttention"):
            if hasattr(module, "dropout_prob"):      # transformers 4's SDPA attention reads this attribute
                module.dropout_prob = p
            if isinstance(getattr(module, "dropout", None), nn.Dropout):  # eager attention (and transformers 5)
                module.dropout.p = p
            count += 1
    if count and hasattr(encoder.backbone, "config"):
        encoder.backbone.config.attention_probs_dropout_prob = p
    return count


def layerwise_groups(encoder: Encoder, params: List[nn.Parameter], decay: float) -> List[dict]:
    """Parameter groups with learning rate × ``decay``^d for a layer d blocks below the top one
    (projection and marker rows: the full rate). Lower layers hold the general-purpose
    features; moving them less is one guard against forgetting out of domain (ULMFiT's
    discriminative fine-tuning; layer-wise decay as in ELECTRA/BEiT fine-tuning)."""
    blocks = list(encoder.backbone.encoder.layer)
    depth = {id(p): len(blocks) - 1 - i for i, block in enumerate(blocks) for p in block.parameters()}
    by_scale: dict = {}
    for p in params:
        by_scale.setdefault(decay ** depth.get(id(p), 0), []).append(p)
    return [{"params": ps, "lr_scale": scale} for scale, ps in sorted(by_scale.items(), reverse=True)]


class StudentScorer(nn.Module):
    """Differentiable S(q,p) and S'(q,s) for a batch of queries × their k+1 passages."""

    def __init__(self, encoder: Encoder, sentence_marker: str = "Q'", in_batch: bool = False, buckets: int = 4,
                 pool_factor=1):
        super().__init__()
        self.encoder = encoder
        #: Pooling-aware training (issue 53): the passage side is pooled as an index with this
        #: ``--pool-factor`` stores it (:mod:`agrame.pooling`), so the loss sees the vectors search will.
        self.pool_factor = pool_factor
        self.sentence_marker = sentence_marker
        #: Score every query against every passage of the batch (the others' are extra negatives).
        self.in_batch = in_batch
        #: Passages are encoded in this many groups of similar length, each padded to its own
        #: longest (SQuAD batches: 64 % of the padded tokens are real, 72 % of the padded compute
        #: is left with 4 groups; the attention mask makes the vectors the same either way).
        self.buckets = max(1, buckets)
        self._passage_cache: dict = {}
        #: On a device, the first steps' clusterings are compared with :mod:`agrame.pooling`'s on the host and
        #: timed (:func:`pool_padded_on_device`); what they found, for the run's ``training.json``.
        self.pooling_checks = 2
        self.pooling_check: List[dict] = []
        self._cache_limit = 200_000

    def passage_batch(self, passages: Sequence[dict]):
        rows, scored, segments, n_sent = [], [], [], []
        for p in passages:
            key = p["text"]
            if key not in self._passage_cache:
                if len(self._passage_cache) >= self._cache_limit:
                    self._passage_cache.clear()  # the full SQuAD train set would otherwise keep every paragraph
                row, keep, offsets = self.encoder.passage_inputs(p["text"])
                seg = token_segments(torch.tensor(offsets, dtype=torch.long), [tuple(s) for s in p["sentences"]])
                self._passage_cache[key] = (row, torch.tensor(keep), seg)
            row, keep, seg = self._passage_cache[key]
            rows.append(row)
            scored.append(keep)
            segments.append(seg)
            n_sent.append(len(p["sentences"]))
        ids, mask = _pad(rows, self.encoder.tokenizer.pad_token_id)
        width = ids.shape[1]
        doc_mask = torch.zeros_like(mask, dtype=torch.bool)
        seg_ids = torch.full(ids.shape, -1, dtype=torch.long)
        for i, (keep, seg) in enumerate(zip(scored, segments)):
            doc_mask[i, :len(keep)] = keep
            seg_ids[i, :len(seg)] = torch.where(keep, seg, torch.full_like(seg, -1))
        return ids, mask, doc_mask, seg_ids, max(n_sent), width

    def encode_passages(self, ids: torch.Tensor, mask: torch.Tensor,
                        lengths: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Token vectors ``[N, width, dim]`` of padded passages, encoded in length groups (zeros
        past each passage's group width, where ``mask`` is 0 anyway). ``lengths``: each passage's
        tokens, known on the host (read from ``mask`` otherwise: a device-to-host copy a step)."""
        if self.buckets == 1 or len(ids) < 2 * self.buckets:
            return self.encoder(ids, mask, detach_embeddings=True)
        lengths = [int(n) for n in (mask.sum(dim=1).tolist() if lengths is None else lengths)]
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        size = -(-len(order) // self.buckets)
        parts, done = [], []
        for start in range(0, len(order), size):
            group = order[start:start + size]
            rows = torch.tensor(group, device=ids.device)
            w = max(lengths[i] for i in group)
            out = self.encoder(ids[rows, :w], mask[rows, :w], detach_embeddings=True)
            parts.append(nn.functional.pad(out, (0, 0, 0, ids.shape[1] - w)))
            done.extend(group)
        inverse = torch.empty(len(done), dtype=torch.long, device=ids.device)
        inverse[torch.tensor(done, device=ids.device)] = torch.arange(len(done), device=ids.device)
        return torch.cat(parts).index_select(0, inverse)

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def query_vectors(self, questions: Sequence[str], marker: str) -> Tuple[torch.Tensor, torch.Tensor]:
        rows, _, attend = self.encoder.query_inputs(questions, marker)
        ids, present = _pad(rows, self.encoder.tokenizer.pad_token_id)
        attention = torch.zeros_like(present)
        for i, a in enumerate(attend):
            attention[i, :len(a)] = torch.tensor(a)
        dev = self.device  # every row position that exists is scored
        return self.encoder(ids.to(dev), attention.to(dev)), present.bool().to(dev)

    def forward(self, batch: Sequence[dict]):
        """Student passage scores ``[B, P]`` (``[B, B·P]`` with in-batch negatives: query b's own
        passages at columns b·P … b·P+P−1), sentence scores ``[B, P, S]`` and the sentence mask."""
        n_p = len(batch[0]["passages"])
        if any(len(r["passages"]) != n_p for r in batch):
            raise ValueError("every query of a batch needs the same number of passages")
        questions = [r["question"] for r in batch]
        q, q_mask = self.query_vectors(questions, "Q")
        if self.encoder.same_query_encoding(self.sentence_marker, "Q"):
            qs, qs_mask = q, q_mask
        else:
            qs, qs_mask = self.query_vectors(questions, self.sentence_marker)
        flat = [p for r in batch for p in r["passages"]]
        ids, mask, doc_mask, seg_ids, n_sent, width = self.passage_batch(flat)
        lengths = mask.sum(dim=1).tolist()  # on the host, before the copy: no device sync to group by length
        dev = self.device
        host_mask, host_seg = doc_mask, seg_ids
        ids, mask, doc_mask, seg_ids = ids.to(dev), mask.to(dev), doc_mask.to(dev), seg_ids.to(dev)
        # Passages hold no trained marker: no gradient into the embeddings, so the frozen lower
        # layers are never back-propagated through for them (the costly side of a step).
        docs = self.encode_passages(ids, mask, lengths).reshape(len(batch), n_p, width, -1)
        doc_mask = doc_mask.reshape(len(batch), n_p, width)
        seg_ids = seg_ids.reshape(len(batch), n_p, width)
        if self.pool_factor != 1 and dev.type == "cpu":
            docs, host_mask, host_seg = pool_padded(docs, host_mask.reshape(len(batch), n_p, width),
                                                    host_seg.reshape(len(batch), n_p, width), self.pool_factor)
            doc_mask, seg_ids, width = host_mask.to(dev), host_seg.to(dev), docs.shape[2]
        elif self.pool_factor != 1:  # on a GPU: the whole batch clustered there (~4 s a step on the host)
            docs, doc_mask, seg_ids, check = pool_padded_on_device(
                docs, host_mask.reshape(len(batch), n_p, width), host_seg.reshape(len(batch), n_p, width),
                self.pool_factor, check=dev.type == "cuda" and self.pooling_checks > len(self.pooling_check))
            if check:
                self.pooling_check.append(check)
            width = docs.shape[2]
        return late_interaction(q, q_mask, None if qs is q else qs, qs_mask, docs, doc_mask, seg_ids, n_sent,
                                in_batch=self.in_batch)


def _host(vectors: torch.Tensor) -> torch.Tensor:
    """The values pooling clusters on, on the host (one copy a step)."""  # (a test stands in on the meta device)
    return vectors.detach().float().cpu()


def pool_padded(docs: torch.Tensor, doc_mask: torch.Tensor, seg_ids: torch.Tensor,
                factor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded passages ``[B, P, W, d]`` on any device (``doc_mask``, ``seg_ids``: ``[B, P, W]`` on the
    host) pooled as an index pools them (:func:`agrame.pooling.pool_assignment` over each passage's scored
    tokens, each run's normalised mean): ``[B, P, W', d]`` on ``docs``' device, its mask and sentence ids
    on the host. The runs are chosen on the host without gradient; the means are differentiable."""
    from agrame.pooling import pool_assignment, pool_by_assignment

    b, n_p, width, dim = docs.shape
    flat = docs.reshape(b * n_p, width, dim)
    host_mask, host_seg = doc_mask.reshape(b * n_p, width).cpu(), seg_ids.reshape(b * n_p, width).cpu()
    host_vec = _host(flat)
    pooled, sentences = [], []
    for i in range(b * n_p):
        keep = host_mask[i].nonzero().flatten()
        assignment = pool_assignment(host_vec[i, keep].numpy(), host_seg[i, keep].numpy(), factor)
        first = np.full(int(assignment.max(initial=-1)) + 1, len(assignment), dtype=np.int64)
        np.minimum.at(first, assignment, np.arange(len(assignment)))
        pooled.append(pool_by_assignment(flat[i, keep.to(docs.device)], assignment).to(docs.dtype))
        sentences.append(host_seg[i, keep][torch.from_numpy(first)])
    out = nn.utils.rnn.pad_sequence(pooled, batch_first=True)  # differentiable: zeros past each passage
    new_width = out.shape[1]
    new_mask = torch.zeros((b * n_p, new_width), dtype=torch.bool)
    new_seg = torch.full((b * n_p, new_width), -1, dtype=torch.long)
    for i, sent in enumerate(sentences):
        new_mask[i, :len(sent)] = True
        new_seg[i, :len(sent)] = sent
    return out.reshape(b, n_p, new_width, dim), new_mask.reshape(b, n_p, new_width), new_seg.reshape(b, n_p, new_width)


def pool_padded_on_device(docs: torch.Tensor, doc_mask: torch.Tensor, seg_ids: torch.Tensor, factor,
                          check: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[dict]]:
    """:func:`pool_padded` with the clustering of the whole batch on ``docs``' device
    (:func:`agrame.pooling.batch_pool_assignment`): ``[B, P, W', d]`` pooled passages with their mask and
    sentence ids, all on that device. The host prepares only what the sentences tell (each passage's scored
    tokens, blocks and merges) and reads nothing back. ``check``: also time the clustering (synchronising the
    device) and compare its assignments with :func:`agrame.pooling.pool_assignment`'s on the host."""
    import time

    from agrame.pooling import BatchPlan, batch_pool, batch_pool_assignment, pool_assignment

    b, n_p, width, dim = docs.shape
    dev = docs.device
    mask, seg = doc_mask.reshape(b * n_p, width).cpu(), seg_ids.reshape(b * n_p, width).cpu()
    # each passage's scored tokens first, in order (a stable sort of the mask), as the host's `keep`
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    lengths = mask.sum(dim=1).tolist()
    segments = seg.gather(1, order)
    plan = BatchPlan([segments[i, :n].numpy() for i, n in enumerate(lengths)], factor, dim)
    order = order[:, :plan.width].to(dev)
    flat = docs.reshape(b * n_p, width, dim).gather(1, order.unsqueeze(-1).expand(-1, -1, dim))
    report = None
    if check:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        began = time.perf_counter()
    assignment = batch_pool_assignment(flat, plan)
    if check:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - began
        got, vectors = assignment.cpu().numpy(), flat.detach().float().cpu().numpy()
        began = time.perf_counter()
        same = sum(bool((pool_assignment(vectors[i, :n], segments[i, :n].numpy(), factor) == got[i, :n]).all())
                   for i, n in enumerate(lengths))
        report = {"passages": len(lengths), "identical": same, "device_s": round(seconds, 4),
                  "host_s": round(time.perf_counter() - began, 3), "rounds": plan.rounds}
    pooled, pooled_seg = batch_pool(flat, assignment, plan.counts, segments[:, :plan.width].to(dev))
    m = pooled.shape[1]
    pooled_mask = (torch.arange(m).unsqueeze(0) < torch.tensor(plan.counts).unsqueeze(1)).to(dev)
    return (pooled.to(docs.dtype).reshape(b, n_p, m, dim), pooled_mask.reshape(b, n_p, m),
            pooled_seg.reshape(b, n_p, m), report)


def late_interaction(q: torch.Tensor, q_mask: torch.Tensor, qs: Optional[torch.Tensor], qs_mask: torch.Tensor,
                     docs: torch.Tensor, doc_mask: torch.Tensor, seg_ids: torch.Tensor, n_sent: int,
                     in_batch: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Differentiable S(q,p) ``[B, P]`` (``[B, B·P]`` with ``in_batch``) and S'(q,s) ``[B, P, S]`` with the
    sentence mask, from unit query vectors ``q`` ``[B, Lq, d]`` (``qs``: the sentence queries', None when
    they are the same) and passage vectors ``docs`` ``[B, P, W, d]`` (``seg_ids``: each token's sentence, −1
    outside). The one place training computes MaxSim (the student's and the frozen-backbone projection's)."""
    b, n_p, width = docs.shape[:3]
    qs_mask = q_mask if qs is None else qs_mask
    neg = torch.finfo(docs.dtype).min
    sim = torch.einsum("bqd,bptd->bpqt", q, docs).masked_fill(~doc_mask.unsqueeze(2), neg)
    passage = (sim.amax(dim=-1) * q_mask.unsqueeze(1)).sum(dim=-1)
    if in_batch and len(docs) > 1:
        flat_docs = docs.reshape(b * n_p, width, -1)
        cross = torch.einsum("bqd,ctd->bcqt", q, flat_docs).masked_fill(
            ~doc_mask.reshape(b * n_p, width).unsqueeze(0).unsqueeze(2), neg)
        passage = (cross.amax(dim=-1) * q_mask.unsqueeze(1)).sum(dim=-1)  # [B, B·P]
    s_sim = sim if qs is None else torch.einsum("bqd,bptd->bpqt", qs, docs).masked_fill(~doc_mask.unsqueeze(2), neg)
    # Segment max over each sentence's tokens: tokens outside sentences go to a spare slot.
    slot = torch.where(seg_ids >= 0, seg_ids, torch.full_like(seg_ids, n_sent))
    index = slot.unsqueeze(2).expand(-1, -1, s_sim.shape[2], -1)
    per = torch.full((*s_sim.shape[:3], n_sent + 1), neg, dtype=s_sim.dtype, device=docs.device)
    per = per.scatter_reduce(3, index, s_sim, reduce="amax", include_self=True)[..., :n_sent]
    # A sentence is present if one scored token falls in it (a scatter: no per-passage host sync on a GPU).
    sentence_mask = torch.zeros((b, n_p, n_sent + 1), dtype=torch.bool, device=docs.device)
    sentence_mask = sentence_mask.scatter(2, slot, True)[..., :n_sent]
    per = per.masked_fill(~sentence_mask.unsqueeze(2), 0.0)  # absent sentences: no −inf into the sum
    sentence = (per * qs_mask.unsqueeze(1).unsqueeze(-1)).sum(dim=2)
    return passage, sentence, sentence_mask


def teacher_tensors(batch: Sequence[dict], n_sent: int) -> Tuple[torch.Tensor, torch.Tensor]:
    passage = torch.tensor([[p["teacher"] for p in r["passages"]] for r in batch], dtype=torch.float32)
    sentence = torch.zeros((len(batch), passage.shape[1], n_sent))
    for b, r in enumerate(batch):
        for p, item in enumerate(r["passages"]):
            scores = item["teacher_sentences"][:n_sent]
            sentence[b, p, :len(scores)] = torch.tensor(scores, dtype=torch.float32)
    return passage, sentence


def in_batch_teacher(t_passage: torch.Tensor) -> torch.Tensor:
    """``[B, P]`` teacher passage logits → ``[B, B·P]``: another query's passage gets this query's
    lowest teacher logit (it is a negative, no more relevant than the worst of its own)."""
    b, p = t_passage.shape
    out = t_passage.amin(dim=1, keepdim=True).expand(b, b * p).clone()
    for i in range(b):
        out[i, i * p:(i + 1) * p] = t_passage[i]
    return out


def make_loss(scorer: StudentScorer, criterion: MultiGranularKLLoss, log: Optional[list] = None):
    def loss(batch: Sequence[dict]) -> torch.Tensor:
        passage, sentence, mask = scorer(batch)
        t_passage, t_sentence = (t.to(passage.device) for t in teacher_tensors(batch, sentence.shape[-1]))
        if passage.shape[-1] != t_passage.shape[-1]:
            t_passage = in_batch_teacher(t_passage)
        labelled = None
        if not all(r.get("sentence_labels", True) for r in batch):  # (agrame train: some pairs unlabelled)
            labelled = torch.tensor([bool(r.get("sentence_labels", True)) for r in batch])
        out = criterion(t_passage, passage, t_sentence, sentence, mask, own_passages=sentence.shape[1],
                        labelled=labelled)
        if log is not None:
            log.append({k: float(v) for k, v in out.items()})
        return out["loss"]
    return loss


def main(argv: Optional[Sequence[str]] = None) -> None:
    from .loop import LoopSettings, train

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, nargs="+",
                        help="distillation JSONL (python -m training.teachers score|labels); several files are "
                             "mixed, FILE@N repeats one N times (e.g. a small second source)")
    parser.add_argument("--out", required=True, help="run folder; the model is written to <out>/final")
    parser.add_argument("--sentence-marker", choices=("Q", "Q'"), default="Q'",
                        help="query marker of the sentence loss (Q': AGRaME; Q: ablation A3)")
    parser.add_argument("--rank-marker", choices=("Q", "Q'"), default=None,
                        help="marker the saved model ranks sub-units with (default: the training one; "
                             "Q after training with Q' is ablation A2)")
    parser.add_argument("--query-marker", choices=("Q", "none"), default="Q",
                        help="passage queries' marker: Q (ColBERT's and AGRaME's [Q]) or none (zero-shot "
                             "MiniLM's own query encoding: with --init-model zero-shot --dim 0 the untrained "
                             "student ranks passages exactly as zero-shot)")
    parser.add_argument("--weighting", choices=("softmax", "sigmoid"), default="softmax")
    parser.add_argument("--sentence-weight", type=float, default=1.0, help="0: passage loss only (ColBERT)")
    parser.add_argument("--layers", type=int, default=2, help="top transformer layers tuned")
    parser.add_argument("--dim", type=int, default=128,
                        help="projection size; 0: none, the backbone's own 384-d vectors (start from "
                             "--init-model zero-shot, so that λ = 0 of the mix is zero-shot MiniLM itself)")
    parser.add_argument("--doc-maxlen", type=int, default=256)
    parser.add_argument("--query-augmentation", action="store_true", help="pad queries with [MASK] (ColBERT)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup", type=float, default=0.1)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--final-at-deadline", action="store_true",
                        help="with --minutes: write the final model when the time budget stops training too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-model", default=None,
                        help="start from this model's weights and projection (e.g. python -m training.projection's "
                             "projected zero-shot model, so that training.interpolate can mix the two) instead of "
                             "MiniLM with a projection from the first training passages")
    parser.add_argument("--layer-lr-decay", type=float, default=1.0,
                        help="learning rate × this per layer below the top one (1: one rate for all)")
    parser.add_argument("--in-batch", action="store_true",
                        help="other queries' passages of the batch are extra passage-loss negatives")
    parser.add_argument("--length-buckets", type=int, default=4,
                        help="encode a batch's passages in this many groups of similar length (speed only; "
                             "1: one padded batch)")
    parser.add_argument("--base", choices=(ZERO_SHOT, E5_SMALL), default=ZERO_SHOT,
                        help="backbone: MiniLM (zero-shot) or multilingual-e5-small (agrame[e5]; e5's prefixes, "
                             "no markers: --sentence-marker and --query-marker do not apply)")
    parser.add_argument("--pool-factor", type=float, default=1,
                        help="pooling-aware training: pool the passage side as 'agrame index --pool-factor F' "
                             "stores it (agrame.pooling), so the student learns for the pooled index (default 1: none)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the student, e.g. cuda (checkpoints and the saved model stay "
                             "device-free: a run may resume on another device)")
    parser.add_argument("--precision", choices=precision.CHOICES, default="auto",
                        help="auto: bfloat16 autocast and TF32 on CUDA, float32 elsewhere (training.precision)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="wall-clock time (seconds since the epoch) by which the final model is written: train "
                             "until then less --save-seconds, the learning-rate schedule laid on that time "
                             "(--steps only caps the count; a device call's schedule)")
    parser.add_argument("--save-seconds", type=float, default=5.0, help="with --deadline: time kept to save")
    parser.add_argument("--checkpoint-every", type=int, default=25,
                        help="steps between resumable checkpoints (0: none, as a device call that never resumes)")
    parser.add_argument("--memory-fraction", type=float, default=None,
                        help="cap of this process's share of its GPU's memory (students side by side)")
    args = parser.parse_args(argv)
    if args.memory_fraction is not None and not 0 < args.memory_fraction <= 1:
        parser.error(f"--memory-fraction {args.memory_fraction}: a share of the GPU's memory, in (0, 1]")
    if args.checkpoint_every < 0 or args.save_seconds < 0:
        parser.error("--checkpoint-every and --save-seconds: 0 or more")
    from agrame.pooling import check_pool_factor

    try:
        args.pool_factor = check_pool_factor(args.pool_factor)
    except ValueError as exc:
        parser.error(f"--pool-factor: {exc}")  # exit 2, before anything is loaded
    if args.sentence_weight == 0:
        # The ColBERT baseline has one query encoding; it ranks sentences with [Q] too.
        args.sentence_marker = "Q"
    if args.base == E5_SMALL:
        args.sentence_marker = args.rank_marker = "Q"  # no marker tokens: one query encoding (see student_encoder)
    torch.manual_seed(args.seed)
    examples = read_mixture(args.data)
    encoder = student_encoder(args.dim, args.query_augmentation, args.doc_maxlen,
                              None if args.query_marker == "none" else DEFAULT_MARKERS["Q"], base=args.base)
    out = Path(args.out)
    if args.init_model:
        start_from(encoder, load_encoder(args.init_model))
    elif not (out / "checkpoint.pt").exists():
        init_projection(encoder, [e["passages"][0]["text"] for e in examples[:128]])
    encoder.to(args.device)  # before the optimizer sees the parameters
    args.precision = precision.apply(encoder, args.device, args.precision)
    precision.limit_memory(args.device, args.memory_fraction)
    params = trainable_parameters(encoder, args.layers)
    if args.layer_lr_decay != 1.0:
        params = layerwise_groups(encoder, params, args.layer_lr_decay)
    scorer = StudentScorer(encoder, args.sentence_marker, in_batch=args.in_batch, buckets=args.length_buckets,
                           pool_factor=args.pool_factor)
    criterion = MultiGranularKLLoss(args.weighting, args.sentence_weight)
    settings = LoopSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                            seed=args.seed, minutes=args.minutes, checkpoint_every=args.checkpoint_every,
                            final_at_deadline=args.final_at_deadline, deadline=args.deadline,
                            save_seconds=args.save_seconds)
    rank_marker = args.rank_marker or args.sentence_marker

    def save(path: Path) -> None:
        final = encoder.to("cpu").with_settings(span_query_marker=rank_marker)
        final.save(path)
        record = dict(vars(args))
        if scorer.pooling_check:  # the device clustering compared with agrame.pooling's, and timed
            record["pooling_check"] = scorer.pooling_check
        (path / "training.json").write_text(json.dumps(record, indent=2))

    print(train(scorer, examples, make_loss(scorer, criterion), settings, out, params=params, save=save))


if __name__ == "__main__":
    main()
