"""Version-1 index (``agrame-index/1``): a folder holding the flat corpus layout of :mod:`agrame.corpus`.

Files: ``manifest.json`` (format, model fingerprint and settings, counts), ``vectors.f16``
(raw float16 ``[T, dim]``, memory-mapped at search time), ``offsets.npy``,
``token_sentence.npy``, ``passage_starts.npy``, ``sentences.npy``,
``sentence_passage.npy`` and ``passages.jsonl``. The folder is written under a temporary
name and renamed into place, so an interrupted build never leaves a half index.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Sequence

import numpy as np
import torch

from .. import __version__
from ..corpus import EncodedCorpus, Passage
from ..encoder import Encoder
from .format import FORMAT_V1 as FORMAT, MANIFEST, IndexFolderError, model_block, read_manifest, write_manifest

VECTORS = "vectors.f16"


def build_index(encoder: Encoder, passages: Sequence[Passage], path: str | Path, *,
                batch_size: int = 16, chunk_passages: int = 1024, overwrite: bool = False,
                progress: bool = True, sentences: Sequence[Sequence[tuple]] | None = None) -> Path:
    """Encode ``passages`` and write an index folder at ``path`` (atomically).

    ``sentences`` optionally gives each passage's sentence spans (default: Punkt).
    """
    from .writer import build_new_folder, check_passages

    path = Path(path)
    passages = check_passages(passages)
    if not passages:
        raise IndexFolderError("no passages to index")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(passages), desc="indexing", unit="psg", disable=None)

    def write(tmp: Path) -> None:
        parts: List[EncodedCorpus] = []
        num_tokens = 0
        with open(tmp / VECTORS, "wb") as vec_file:
            for lo in range(0, len(passages), chunk_passages):
                chunk = list(passages[lo:lo + chunk_passages])
                encoded = encoder.encode_passages([p.text for p in chunk], batch_size=batch_size)
                given = None if sentences is None else sentences[lo:lo + chunk_passages]
                part = EncodedCorpus.build(chunk, encoded, given)
                vec_file.write(part.vectors.to(torch.float16).numpy().tobytes())
                num_tokens += part.num_tokens
                # Keep everything but the vectors, which are already on disk.
                part.vectors = torch.empty((0, part.vectors.shape[1]))
                parts.append(part)
                if bar is not None:
                    bar.update(len(chunk))
        _write_tables(tmp, parts)
        num_sentences = sum(int(p.sentences.shape[0]) for p in parts)
        manifest = {
            "format": FORMAT,
            "agrame_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": model_block(encoder),
            "dim": encoder.dim,
            "num_passages": len(passages),
            "num_tokens": num_tokens,
            "num_sentences": num_sentences,
            "vectors_dtype": "float16",
        }
        write_manifest(tmp, manifest)

    try:
        # Format 1 has no generations: a replaced index swaps places with the new one atomically.
        build_new_folder(path, overwrite, write, exchange=True)
    finally:
        if bar is not None:
            bar.close()
    return path


def _write_tables(folder: Path, parts: List[EncodedCorpus]) -> None:
    token_base, sentence_base = 0, 0
    offsets, token_sentence, starts, sentences, sentence_passage = [], [], [np.zeros(1, np.int64)], [], []
    passage_base = 0
    with open(folder / "passages.jsonl", "w", encoding="utf-8") as out:
        for part in parts:
            for pid, text in zip(part.ids, part.texts):
                out.write(json.dumps({"id": pid, "text": text}, ensure_ascii=False) + "\n")
            offsets.append(part.offsets.numpy().astype(np.int32))
            ts = part.token_sentence.numpy()
            token_sentence.append(np.where(ts >= 0, ts + sentence_base, -1).astype(np.int32))
            starts.append(part.passage_starts.numpy()[1:] + token_base)
            sentences.append(part.sentences.numpy().astype(np.int32))
            sentence_passage.append((part.sentence_passage.numpy() + passage_base).astype(np.int32))
            token_base += int(part.passage_starts[-1])
            sentence_base += int(part.sentences.shape[0])
            passage_base += len(part)
    np.save(folder / "offsets.npy", np.concatenate(offsets).reshape(-1, 2))
    np.save(folder / "token_sentence.npy", np.concatenate(token_sentence))
    np.save(folder / "passage_starts.npy", np.concatenate(starts))
    np.save(folder / "sentences.npy", np.concatenate(sentences).reshape(-1, 2))
    np.save(folder / "sentence_passage.npy", np.concatenate(sentence_passage))


def load_index(path: str | Path) -> tuple[dict, EncodedCorpus]:
    """Open an index; vectors stay memory-mapped (float16) and are scored chunk by chunk."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest["format"] != FORMAT:
        raise IndexFolderError(f"{path} is a {manifest['format']} index; open it with agrame.index.Index")
    try:
        vectors = np.memmap(path / VECTORS, dtype=np.float16, mode="r",
                            shape=(manifest["num_tokens"], manifest["dim"]))
        ids, texts = [], []
        with open(path / "passages.jsonl", encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                ids.append(record["id"])
                texts.append(record["text"])
        starts = torch.from_numpy(np.load(path / "passage_starts.npy"))
        corpus = EncodedCorpus(
            ids=ids, texts=texts, vectors=vectors,  # type: ignore[arg-type]
            offsets=torch.from_numpy(np.load(path / "offsets.npy").astype(np.int64)),
            token_passage=torch.repeat_interleave(torch.arange(len(ids)), starts.diff()),
            token_sentence=torch.from_numpy(np.load(path / "token_sentence.npy").astype(np.int64)),
            sentences=torch.from_numpy(np.load(path / "sentences.npy").astype(np.int64)),
            sentence_passage=torch.from_numpy(np.load(path / "sentence_passage.npy").astype(np.int64)),
            passage_starts=starts,
        )
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise IndexFolderError(f"index {path} is damaged: {exc}") from None
    if len(ids) != manifest["num_passages"] or int(starts[-1]) != manifest["num_tokens"]:
        raise IndexFolderError(f"index {path} is damaged: counts disagree with {MANIFEST}")
    return manifest, corpus
