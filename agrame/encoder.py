"""Multi-vector encoder: backbone + linear projection + L2-normalised token vectors.

Queries are encoded as ``[CLS] marker tokens… [SEP] [MASK]…`` (padded with ``[MASK]``
to ``query_maxlen``; the mask tokens are scored, ColBERT's query augmentation), passages
as ``[CLS] [D] tokens… [SEP]``. Passages longer than ``doc_maxlen`` are encoded in
overlapping windows; every token keeps the vector of the window where it has the most
context, so a passage always maps to one token sequence covering all of its text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import nn

FORMAT = "agrame-checkpoint/1"
SETTINGS_FILE = "agrame.json"
PROJECTION_FILE = "projection.safetensors"

#: Marker names → vocabulary tokens. BERT vocabularies have unused rows, so no resize:
#: [Q] and [D] are ColBERTv2's choice (keeps its checkpoints loadable), [Q'] is AGRaME's.
DEFAULT_MARKERS: Dict[str, str] = {"Q": "[unused0]", "D": "[unused1]", "Q'": "[unused2]"}


class ModelError(ValueError):
    """A model path is missing or is not a loadable model folder."""


@dataclass
class EncoderSettings:
    """Everything besides weights that defines how a checkpoint encodes and scores."""

    dim: Optional[int] = 128  # projection size; None = raw backbone vectors (zero-shot)
    query_maxlen: int = 32
    doc_maxlen: int = 256
    doc_overlap: int = 64  # tokens shared by consecutive windows of a long passage
    markers: Dict[str, Optional[str]] = field(default_factory=lambda: dict(DEFAULT_MARKERS))
    #: Marker used to encode the query for sub-unit (sentence/span) ranking: "Q'" or "Q".
    span_query_marker: str = "Q'"
    mask_punctuation: bool = True
    #: Pad queries with scored [MASK] tokens to query_maxlen (ColBERT's query augmentation).
    query_augmentation: bool = True
    attend_to_mask_tokens: bool = False
    alpha: float = 0.5
    #: Text put before every query / passage after the special tokens (e5's "query:" and
    #: "passage:", which it was trained with); its tokens are scored like a marker's.
    query_prefix: str = ""
    passage_prefix: str = ""
    #: The pool factor an index built with this model uses unless told otherwise (:mod:`agrame.pooling`;
    #: 1: one vector per token). Not a document-side setting: the vectors are the model's either way.
    pool_factor: float = 1
    #: Search budgets chosen for this model on its own train questions (``nprobe``, ``ncandidates``,
    #: ``per_hit``; ``python -m benchmarks.index_search choose``): an index built with it records them.
    #: None: the package's (:class:`agrame.index.SearchSettings`).
    search: Optional[Dict[str, int]] = None
    #: The residual codec an index built with this model uses unless told otherwise ("2bit", "pq16x6":
    #: :func:`agrame.index.codec.parse_residuals`; chosen by ``benchmarks.residual_codecs``' rule).
    residuals: str = "2bit"

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        # written only when set: a model (and an index's record of it) from before them reads the same
        for name, unset in (("pool_factor", 1), ("search", None), ("residuals", "2bit")):
            if data[name] == unset:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "EncoderSettings":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"unknown settings {unknown} in {SETTINGS_FILE}")
        settings = cls(**data)
        settings.validate()
        return settings

    def validate(self) -> None:
        from .pooling import check_pool_factor

        try:
            self.pool_factor = check_pool_factor(self.pool_factor)
        except ValueError as exc:
            raise ModelError(f"pool_factor: {exc}") from None
        from .index.codec import residuals_name

        try:
            self.residuals = residuals_name(self.residuals)
        except ValueError as exc:
            raise ModelError(f"residuals: {exc}") from None
        if self.search is not None and (
                not isinstance(self.search, dict) or set(self.search) - {"nprobe", "ncandidates", "per_hit"}
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.search.values())):
            raise ModelError("search must map nprobe, ncandidates and per_hit to positive integers")
        if self.query_maxlen < 4:
            raise ModelError("query_maxlen must be at least 4")
        if self.doc_maxlen < 8:
            raise ModelError("doc_maxlen must be at least 8")
        if not 0 <= self.doc_overlap < self.doc_maxlen - 3:
            raise ModelError("doc_overlap must be in [0, doc_maxlen - 3)")
        if self.span_query_marker not in ("Q", "Q'"):
            raise ModelError("span_query_marker must be 'Q' or \"Q'\"")
        for name in ("Q", "Q'", "D"):
            if name not in self.markers:
                raise ModelError(f"markers must name {name!r} (a token, or null for none)")


class EncodedPassage(NamedTuple):
    """Token vectors of one passage and the characters each covers (special tokens: start == end)."""

    vectors: torch.Tensor  # [n, dim] float32, unit length
    offsets: torch.Tensor  # [n, 2] int64, character offsets into the passage text


class EncodedQuery(NamedTuple):
    """Token vectors of one query (all scored positions, [MASK] augmentation included)."""

    vectors: torch.Tensor  # [Lq, dim]
    offsets: torch.Tensor  # [Lq, 2]; special and [MASK] tokens have start == end


class Encoder(nn.Module):
    """A Hugging Face backbone with an optional linear projection to ``settings.dim``."""

    #: Mixed precision of the backbone and projection (None: the weights' own dtype, the CPU's path). On a
    #: GPU, bfloat16 autocast runs the transformer on its tensor cores; the token vectors still leave in
    #: float32, so every score and loss downstream sums float32 values (training.precision sets it).
    compute_dtype: Optional[torch.dtype] = None

    def __init__(self, backbone: nn.Module, tokenizer, settings: EncoderSettings,
                 projection: Optional[nn.Linear] = None, source: str = "<memory>"):
        super().__init__()
        settings.validate()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.settings = settings
        self.projection = projection
        self.source = source
        self._marker_ids = self._resolve_markers()
        self._text_prefix_ids = {side: (self.tokenizer.encode(text, add_special_tokens=False) if text else [])
                                 for side, text in (("query", settings.query_prefix),
                                                    ("passage", settings.passage_prefix))}
        self._skip_ids = self._punctuation_ids() if settings.mask_punctuation else set()
        last = self.tokenizer.convert_ids_to_tokens(self.tokenizer.encode("a b", add_special_tokens=False))[-1]
        self._offsets_include_spaces = last.startswith("\u2581")
        self._fingerprint: Optional[str] = None
        self.eval()

    # -- vocabulary facts, each decided once --------------------------------------
    def _resolve_markers(self) -> Dict[str, Optional[int]]:
        vocab = self.tokenizer.get_vocab()
        ids: Dict[str, Optional[int]] = {}
        for name, token in self.settings.markers.items():
            if token is None:
                ids[name] = None
            elif token in vocab:
                ids[name] = vocab[token]
            else:
                raise ModelError(f"marker {name}={token!r} is not in the tokenizer's vocabulary")
        return ids

    def marker_id(self, name: Optional[str]) -> Optional[int]:
        """Vocabulary id of marker ``name`` ("Q", "Q'" or "D"); None when disabled or ``name`` is None."""
        return None if name is None else self._marker_ids[name]

    def _punctuation_ids(self) -> set:
        # A SentencePiece vocabulary spells "." as "▁." or "▁" + "."; the bare metaspace is a word
        # boundary, not punctuation, and is kept.
        vocab = self.tokenizer.get_vocab()
        ids = set()
        for symbol in string.punctuation:
            ids.update(i for i in self.tokenizer.encode(symbol, add_special_tokens=False)
                       if self.tokenizer.convert_ids_to_tokens(i).strip("\u2581")
                       and i != self.tokenizer.unk_token_id)  # a symbol outside the vocabulary
            if "\u2581" + symbol in vocab:
                ids.add(vocab["\u2581" + symbol])
        return ids

    def with_settings(self, **changes) -> "Encoder":
        """The same weights under other settings (e.g. other markers); weights are shared, not copied."""
        settings = dataclasses.replace(self.settings, **changes)
        other = Encoder(self.backbone, self.tokenizer, settings, self.projection, source=self.source)
        other.compute_dtype = self.compute_dtype
        return other

    def same_query_encoding(self, marker_a: Optional[str], marker_b: Optional[str]) -> bool:
        """True when two query markers resolve to the same input (same token, or both none)."""
        return self.marker_id(marker_a) == self.marker_id(marker_b)

    @property
    def dim(self) -> int:
        if self.projection is not None:
            return self.projection.out_features
        return int(self.backbone.config.hidden_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.backbone.config, "max_position_embeddings", 512))

    #: Settings that change passage vectors; query-side ones (markers [Q]/[Q'], [MASK]
    #: padding, α, …) do not, so an index stays valid when they change.
    DOCUMENT_SETTINGS = ("dim", "doc_maxlen", "doc_overlap", "mask_punctuation")

    def fingerprint(self) -> str:
        """sha256 over every weight, the vocabulary and the document-side settings.

        Two encoders with the same fingerprint produce the same passage vectors, so an index
        records it and refuses an encoder with another one.
        """
        if self._fingerprint is None:
            digest = hashlib.sha256()
            doc_side = {k: getattr(self.settings, k) for k in self.DOCUMENT_SETTINGS}
            doc_side["doc_marker"] = self.settings.markers.get("D")
            if self.settings.passage_prefix:  # only when set: older fingerprints stay valid
                doc_side["passage_prefix"] = self.settings.passage_prefix
            digest.update(json.dumps(doc_side, sort_keys=True).encode())
            digest.update(json.dumps(self.tokenizer.get_vocab(), sort_keys=True).encode())
            for name, tensor in sorted(self.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    # -- forward ---------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                detach_embeddings: bool = False) -> torch.Tensor:
        """Unit token vectors. ``detach_embeddings`` (training): no gradient flows back into the
        word embeddings, so frozen lower layers need no backward pass for these inputs."""
        mixed = (torch.autocast(input_ids.device.type, dtype=self.compute_dtype) if self.compute_dtype is not None
                 else contextlib.nullcontext())
        with mixed:
            if detach_embeddings:
                embeds = self.backbone.get_input_embeddings()(input_ids).detach()
                hidden = self.backbone(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
            else:
                hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if self.projection is not None:
                hidden = self.projection(hidden)
        if self.compute_dtype is not None:
            hidden = hidden.float()
        return nn.functional.normalize(hidden, p=2, dim=-1)

    def _tokenize(self, texts: Sequence[str]):
        enc = self.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                             return_attention_mask=False, verbose=False)
        offsets = enc["offset_mapping"]
        if self._offsets_include_spaces:
            # A metaspace token ("▁word") covers the space before its word; a span's tokens are
            # the word's characters only (WordPiece offsets never include the space).
            offsets = [[(a + 1, b) if b - a > 1 and text[a].isspace() else (a, b) for a, b in offs]
                       for text, offs in zip(texts, offsets)]
        return enc["input_ids"], offsets

    def _prefix(self, marker: Optional[int], side: str = "passage") -> List[int]:
        return [self.tokenizer.cls_token_id] + ([] if marker is None else [marker]) + self._text_prefix_ids[side]

    # -- queries -------------------------------------------------------------------
    def encode_queries(self, texts: Sequence[str], markers: Sequence[Optional[str]] = ("Q",)) -> List[List[EncodedQuery]]:
        """Encode every query once per marker (None: no marker), all in one forward batch.

        Returns ``result[m][i]`` for marker ``markers[m]`` and query ``texts[i]``. A query
        longer than ``query_maxlen`` is kept whole (no silent truncation) and simply gets
        no ``[MASK]`` padding; one longer than the backbone's positions is an error.
        """
        rows, row_offsets, row_attend = [], [], []
        for name in markers:
            r, o, a = self.query_inputs(texts, name)
            rows += r
            row_offsets += o
            row_attend += a
        vectors = self._run(rows, row_attend)
        out: List[List[EncodedQuery]] = []
        for m in range(len(markers)):
            per_marker = []
            for i in range(len(texts)):
                r = m * len(texts) + i
                per_marker.append(EncodedQuery(vectors[r, : len(rows[r])],  # drop the batch's [PAD] rows
                                               torch.tensor(row_offsets[r], dtype=torch.long).reshape(-1, 2)))
            out.append(per_marker)
        return out

    def query_inputs(self, texts: Sequence[str], marker: Optional[str]):
        """Token ids, character offsets and attention of each query row (the one place queries are built).

        ``[CLS] (marker) tokens [SEP]`` then, with query augmentation, ``[MASK]`` up to
        ``query_maxlen``. Training builds its query batches here too.
        """
        ids_list, offs_list = self._tokenize(texts)
        mask_id = self.tokenizer.mask_token_id
        sep = self.tokenizer.sep_token_id
        prefix = self._prefix(self.marker_id(marker), "query")
        rows, row_offsets, row_attend = [], [], []
        for ids, offs in zip(ids_list, offs_list):
            seq = prefix + list(ids) + [sep]
            if len(seq) > self.max_positions:
                raise ValueError(f"query of {len(ids)} tokens exceeds the model's {self.max_positions} positions")
            pad = max(0, self.settings.query_maxlen - len(seq)) if self.settings.query_augmentation else 0
            row_attend.append([1] * len(seq) + [int(self.settings.attend_to_mask_tokens)] * pad)
            rows.append(seq + [mask_id] * pad)
            row_offsets.append([(0, 0)] * len(prefix) + [tuple(o) for o in offs] + [(0, 0)] * (1 + pad))
        return rows, row_offsets, row_attend

    def query_tokens(self, text: str, marker: Optional[str]) -> List[tuple]:
        """(wordpiece, start, end) of each scored row of the query encoded with ``marker``
        (special tokens, markers and [MASK] padding have start == end)."""
        rows, offsets, _ = self.query_inputs([text], marker)
        tokens = self.tokenizer.convert_ids_to_tokens(rows[0])
        return [(tok, int(a), int(b)) for tok, (a, b) in zip(tokens, offsets[0])]

    def passage_inputs(self, text: str):
        """Token ids of a passage's first window and, per row position, whether it is scored and
        its character offsets (training encodes one window: SQuAD paragraphs fit in 256)."""
        ids_list, offs_list = self._tokenize([text])
        ids, offs = list(ids_list[0])[: self._window_width()], list(offs_list[0])[: self._window_width()]
        prefix = self._prefix(self.marker_id("D"))
        row = prefix + ids + [self.tokenizer.sep_token_id]
        scored = [True] * len(prefix) + [i not in self._skip_ids for i in ids] + [True]
        offsets = [(0, 0)] * len(prefix) + [tuple(o) for o in offs] + [(0, 0)]
        return row, scored, offsets

    def encode_query(self, text: str, marker: str = "Q") -> EncodedQuery:
        return self.encode_queries([text], (marker,))[0][0]

    # -- passages ------------------------------------------------------------------
    def _window_width(self) -> int:
        """Passage tokens per window: doc_maxlen minus [CLS], [D] (if any), the text prefix and [SEP]."""
        return self.settings.doc_maxlen - 1 - len(self._prefix(self.marker_id("D")))

    def _windows(self, n: int) -> List[int]:
        width = self._window_width()
        stride = width - self.settings.doc_overlap
        starts = [0]
        while starts[-1] + width < n:
            starts.append(starts[-1] + stride)
        return starts

    def encode_passages(self, texts: Sequence[str], batch_size: int = 16,
                        progress: bool = False) -> List[EncodedPassage]:
        """Encode passages; long ones in overlapping windows mapped back to the full text."""
        ids_list, offs_list = self._tokenize(texts)
        width = self._window_width()
        prefix = self._prefix(self.marker_id("D"))
        sep = self.tokenizer.sep_token_id
        windows = []  # (passage index, window start, token ids)
        for p, ids in enumerate(ids_list):
            for start in self._windows(len(ids)):
                windows.append((p, start, prefix + list(ids[start:start + width]) + [sep]))
        order = sorted(range(len(windows)), key=lambda w: -len(windows[w][2]))
        window_vectors: List[Optional[torch.Tensor]] = [None] * len(windows)
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(texts), desc="encoding passages", unit="psg", disable=None)
        done_per_passage = [0] * len(texts)
        n_windows = [0] * len(texts)
        for p, _, _ in windows:
            n_windows[p] += 1
        for b in range(0, len(order), batch_size):
            batch = order[b:b + batch_size]
            vecs = self._run([windows[w][2] for w in batch], [[1] * len(windows[w][2]) for w in batch])
            for k, w in enumerate(batch):
                window_vectors[w] = vecs[k, : len(windows[w][2])]
                p = windows[w][0]
                done_per_passage[p] += 1
                if bar is not None and done_per_passage[p] == n_windows[p]:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return self._assemble(ids_list, offs_list, windows, window_vectors, len(prefix))

    def _assemble(self, ids_list, offs_list, windows, window_vectors, prefix_len) -> List[EncodedPassage]:
        by_passage: Dict[int, List[int]] = {}
        for w, (p, _, _) in enumerate(windows):
            by_passage.setdefault(p, []).append(w)
        out = []
        for p, (ids, offs) in enumerate(zip(ids_list, offs_list)):
            ws = by_passage[p]
            first = window_vectors[ws[0]]
            n = len(ids)
            dim = first.shape[-1]
            content = torch.empty((n, dim), dtype=first.dtype)
            best_context = torch.full((n,), -1, dtype=torch.long)
            for w in ws:
                _, start, seq = windows[w]
                length = len(seq) - prefix_len - 1
                pos = torch.arange(start, start + length)
                # Prefer the window where the token sees the most context on both sides.
                context = torch.minimum(pos - start, start + length - 1 - pos)
                better = context > best_context[pos]
                content[pos[better]] = window_vectors[w][prefix_len:prefix_len + length][better]
                best_context[pos[better]] = context[better]
            keep = self._kept(ids)
            specials = torch.cat([first[:prefix_len], first[-1:]])  # [CLS] ([D]) and [SEP] of window 0
            vectors = torch.cat([specials, content[keep]])
            out.append(EncodedPassage(vectors, self._kept_offsets(offs, keep, prefix_len)))
        return out

    def _kept(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([i not in self._skip_ids for i in ids], dtype=torch.bool)

    @staticmethod
    def _kept_offsets(offs, keep: torch.Tensor, prefix_len: int) -> torch.Tensor:
        # Row order of an encoded passage: [CLS] ([D]) [SEP] first (offsets (0, 0)), then the kept tokens.
        return torch.cat([torch.zeros((prefix_len + 1, 2), dtype=torch.long),
                          torch.tensor(offs, dtype=torch.long).reshape(-1, 2)[keep]])

    def passage_offsets(self, texts: Sequence[str]) -> List[torch.Tensor]:
        """The ``offsets`` :meth:`encode_passages` gives each text, from the tokenizer alone (no model
        run): tokenisation is deterministic, so a compressed index need not store them."""
        ids_list, offs_list = self._tokenize(texts)
        prefix_len = len(self._prefix(self.marker_id("D")))
        return [self._kept_offsets(offs, self._kept(ids), prefix_len) for ids, offs in zip(ids_list, offs_list)]

    @torch.inference_mode()
    def _run(self, rows: List[List[int]], attend: List[List[int]]) -> torch.Tensor:
        length = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([a + [0] * (length - len(a)) for a in attend], dtype=torch.long)
        device = next(self.parameters()).device
        return self(ids.to(device), mask.to(device)).float().cpu()

    # -- persistence -----------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write a checkpoint folder: backbone files, projection and ``agrame.json``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.projection is not None:
            save_file({"weight": self.projection.weight.detach().contiguous()}, str(path / PROJECTION_FILE))
        meta = {"format": FORMAT, **self.settings.to_json()}
        (path / SETTINGS_FILE).write_text(json.dumps(meta, indent=2) + "\n")
