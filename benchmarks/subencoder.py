"""Sub-Sentence Encoder baseline (Chen et al. 2023): one encoding of a sentence, one vector per
proposition by mean-pooling that proposition's token vectors, then an MLP head.

The zero-shot variant (``head=False``) is plain mask pooling of MiniLM's token vectors, as
in that paper's appendix.
"""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from agrame.backbones import default_model_path
from agrame.spans import SpanLike, span_token_mask

from agrame.training.losses import SupConLoss


class SubEncoder(nn.Module):
    def __init__(self, head: bool = True, model_path: Optional[str] = None, max_length: int = 256):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        path = str(model_path or default_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.backbone = AutoModel.from_pretrained(path, add_pooling_layer=False)
        hidden = self.backbone.config.hidden_size
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)) if head else None
        self.max_length = max_length

    def forward(self, sentences: Sequence[str], spans: Sequence[Sequence[SpanLike]]) -> torch.Tensor:
        """``[total spans, hidden]`` unit vectors: for each sentence, one per span, in order."""
        enc = self.tokenizer(list(sentences), truncation=True, max_length=self.max_length, padding=True,
                             return_offsets_mapping=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")
        hidden = self.backbone(**enc).last_hidden_state
        pooled = []
        for b, sentence_spans in enumerate(spans):
            if not sentence_spans:
                continue
            mask = span_token_mask(offsets[b], sentence_spans).to(hidden.dtype)  # [S, L]
            if (mask.sum(dim=1) == 0).any():
                raise ValueError(f"a span of sentence {b} covers no token (truncated at {self.max_length}?)")
            pooled.append(mask @ hidden[b] / mask.sum(dim=1, keepdim=True))
        vectors = torch.cat(pooled)
        if self.head is not None:
            vectors = self.head(vectors)
        return nn.functional.normalize(vectors, dim=-1)

    @torch.inference_mode()
    def encode(self, sentences: Sequence[str], spans: Sequence[Sequence[SpanLike]],
               batch_size: int = 32) -> torch.Tensor:
        self.eval()
        out = []
        for b in range(0, len(sentences), batch_size):
            out.append(self(sentences[b:b + batch_size], spans[b:b + batch_size]))
        return torch.cat(out) if out else torch.empty(0)


#: One training group: sentences with their propositions (spans), and a label per proposition;
#: propositions with equal labels entail each other (positives), all others are negatives.
Item = Tuple[str, Tuple, int]  # (sentence text, proposition span, label)


def train_subencoder(batches: Sequence[List[Item]], *, epochs: int = 5, lr: float = 2e-5,
                     temperature: float = 0.01, seed: int = 0, log=None,
                     model_path: Optional[str] = None) -> SubEncoder:
    """Fine-tune backbone and head with :class:`SupConLoss` over the given batches."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = SubEncoder(head=True, model_path=model_path)
    loss_fn = SupConLoss(temperature)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    order = list(range(len(batches)))
    for epoch in range(epochs):
        rng.shuffle(order)
        model.train()
        total = 0.0
        for i in order:
            items = batches[i]
            texts = sorted({t for t, _, _ in items})
            index = {t: k for k, t in enumerate(texts)}
            per_sentence: List[List] = [[] for _ in texts]
            labels_per: List[List[int]] = [[] for _ in texts]
            for text, span, label in items:
                per_sentence[index[text]].append(span)
                labels_per[index[text]].append(label)
            vectors = model(texts, per_sentence)
            labels = torch.tensor([label for ls in labels_per for label in ls])
            loss = loss_fn(vectors, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        if log is not None:
            log(f"epoch {epoch + 1}/{epochs}: mean loss {total / max(1, len(batches)):.4f}")
    model.eval()
    return model
