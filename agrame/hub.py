"""Hugging Face Hub names (issue 63): ``org/name`` or ``org/name@revision`` wherever a model is named.

A name resolves to a snapshot folder through ``huggingface_hub`` and its cache (``HF_HUB_CACHE`` /
``HF_HOME``), downloading only when the hub may be reached: with ``HF_HUB_OFFLINE=1`` (or no network) the
cached snapshot is used, and a model that is not cached is a :class:`~agrame.encoder.ModelError` saying so.
The folder is then loaded as any local folder is (:func:`agrame.loading.load_encoder`: an AGRaME checkpoint
or delta, a Stanford ColBERT or PyLate checkpoint, a plain Hugging Face model — recognised by their files).
The loaded encoder's ``source`` is ``org/name@<commit>``, so an index built with it records the exact
revision and loads that one again.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Tuple

from .encoder import ModelError

#: ``org/name`` with an optional ``@revision`` (a branch, a tag or a commit), as the hub spells repository ids.
_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[A-Za-z0-9._/-]+))?$")
#: Files a checkpoint never needs here (other frameworks' copies of the weights).
IGNORE = ["*.onnx", "onnx/*", "openvino/*", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.gguf", "flax_model*",
          "tf_model*", "rust_model*", "coreml/*"]
_TRUE = {"1", "true", "yes", "on"}


def split_name(name: str) -> Optional[Tuple[str, Optional[str]]]:
    """``(repo_id, revision)`` of a hub name, or None when ``name`` is not one."""
    match = _NAME.match(str(name))
    if match is None or ".." in str(name):
        return None
    return match["repo"], match["rev"]


def is_hub_name(name: str) -> bool:
    """A hub name that is not a folder here (a local folder of that relative path wins)."""
    return split_name(str(name)) is not None and not Path(str(name)).exists()


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now, not when huggingface_hub was imported."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_dir() -> Optional[str]:
    """The hub cache as the environment names it now (None: huggingface_hub's own default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def resolve(name: str) -> Tuple[Path, str]:
    """The local snapshot folder of hub model ``name`` and its commit (downloaded unless offline)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    parts = split_name(name)
    if parts is None:
        raise ModelError(f"model {name!r}: not a Hugging Face name (org/name or org/name@revision)")
    repo, revision = parts
    where = cache_dir() or constants.HF_HUB_CACHE
    no_net = offline()
    try:
        folder = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), local_files_only=no_net,
                                        ignore_patterns=IGNORE))
    except (LocalEntryNotFoundError, FileNotFoundError):
        why = "HF_HUB_OFFLINE is set" if no_net else "the hub could not be reached"
        rev = f" at revision {revision!r}" if revision else ""
        raise ModelError(f"model {name!r}: no such folder here, and not in the Hugging Face cache ({where}){rev} "
                         f"and {why}; download it "
                         f"where the hub is reachable (huggingface-cli download {repo}"
                         f"{' --revision ' + revision if revision else ''}) or pass a local folder") from None
    except RevisionNotFoundError:
        raise ModelError(f"model {name!r}: the hub has no revision {revision!r} of {repo}") from None
    except GatedRepoError:
        raise ModelError(f"model {name!r}: {repo} is gated on the hub; log in (huggingface-cli login) after "
                         "accepting its terms") from None
    except RepositoryNotFoundError:
        raise ModelError(f"model {name!r}: no such folder here, and no such repository on the hub (or it is "
                         "private: huggingface-cli login)") from None
    except OSError as exc:  # a network failure huggingface_hub did not turn into one of the above
        raise ModelError(f"model {name!r}: the hub could not be reached ({exc}); set HF_HUB_OFFLINE=1 to use "
                         "the cache") from None
    if not any(folder.iterdir()):
        raise ModelError(f"model {name!r}: its snapshot {folder} is empty")
    return folder, folder.name


__all__ = ["IGNORE", "cache_dir", "is_hub_name", "offline", "resolve", "split_name"]
