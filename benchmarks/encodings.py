"""Cached encodings of the pooled corpus, built shard by shard (resumable), reused by all runs.

    python -m benchmarks.encodings --what colbert colbert-sentences single-vector

Multi-vector encodings are AGRaME index folders (one per shard); single vectors are
float16 ``.npy`` shards. Everything lives under ``$AGRAME_CACHE`` (default ``cache/``),
keyed by the model fingerprint and a hash of the texts, so a changed model or pool never
reads a stale cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from agrame.corpus import EncodedCorpus, Passage
from agrame.encoder import Encoder
from agrame.backbones import default_model_path
from agrame.loading import load_encoder
from agrame.index.format import MANIFEST, model_block, read_manifest, write_manifest
from agrame.index.v1 import VECTORS, build_index, load_index
from agrame.spans import split_sentences

from .common import REPO
from .data import Pool, load_pool

SHARD = 2048
WHAT = ("colbert", "colbert-sentences", "single-vector")


def cache_root() -> Path:
    return Path(os.environ.get("AGRAME_CACHE", REPO / "cache"))


def _hash(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:12]


def pool_sentences(pool: Pool) -> List[List[Tuple[int, int]]]:
    """Sentence spans of every pool passage (Punkt), cached."""
    path = cache_root() / f"sentences-{_hash(pool.texts)}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    spans = [split_sentences(t) for t in tqdm(pool.texts, desc="splitting sentences", disable=None)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(spans, f)
    tmp.replace(path)
    return spans


def sentence_texts(texts: Sequence[str], spans: Sequence[Sequence[Tuple[int, int]]]) -> Tuple[List[str], np.ndarray]:
    """All sentences in passage order, and ``starts[p]``: global index of passage p's first sentence."""
    sentences = [texts[p][s:e] for p, sp in enumerate(spans) for s, e in sp]
    starts = np.zeros(len(spans) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(sp) for sp in spans])
    return sentences, starts


def _builder_alive(name: str) -> bool:
    """Whether the process that writes temporary shard ``name`` (``….tmp-PID…``) is running (not this one: a
    process starts ``ensure`` with nothing of its own in flight)."""
    match = re.search(r"\.tmp-(\d+)", name)
    if match is None:
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class MultiVectorCache:
    """Shards of AGRaME index folders over a list of texts; ``select`` gathers passages."""

    def __init__(self, encoder: Encoder, texts: Sequence[str], name: str,
                 spans: Sequence[Sequence[Tuple[int, int]]] | None = None):
        self.encoder, self.texts, self.spans = encoder, list(texts), spans
        self.folder = cache_root() / f"{name}-{encoder.fingerprint()[:12]}-{_hash(self.texts)}"
        self.n_shards = (len(self.texts) + SHARD - 1) // SHARD
        self._shards: List[EncodedCorpus] = []
        self._base: Path | None = None  # where the unprojected backbone's cache would be (projected_base)

    def sweep(self) -> None:
        """Remove temporary shards whose builder is gone (a killed run's)."""
        if self.folder.exists():
            for stale in self.folder.glob(".shard-*.tmp-*"):
                if not _builder_alive(stale.name):
                    shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)

    def ensure(self) -> "MultiVectorCache":
        """Encode missing shards. Leftovers of killed runs are removed; a live builder's temporary shards (another
        process encoding the same cache: its pid is in their names) are left to it (issue 62)."""
        self.sweep()
        missing = [i for i in range(self.n_shards) if not (self.folder / f"shard-{i:05d}").exists()]
        base = self.projected_base() if missing else None
        if base is not None:
            for i in tqdm(missing, desc=f"projecting {base.name}", unit="shard", disable=None):
                project_index(base / f"shard-{i:05d}", self.folder / f"shard-{i:05d}", self.encoder)
            missing = []
        if missing:
            bar = tqdm(total=len(missing) * SHARD, desc=f"encoding {self.folder.name}", unit="psg", disable=None)
            for i in missing:
                lo = i * SHARD
                chunk = [Passage(str(j), t) for j, t in enumerate(self.texts[lo:lo + SHARD], start=lo)]
                given = None if self.spans is None else self.spans[lo:lo + SHARD]
                build_index(self.encoder, chunk, self.folder / f"shard-{i:05d}", progress=False, sentences=given)
                bar.update(len(chunk))
            bar.close()
        self._shards = [load_index(self.folder / f"shard-{i:05d}")[1] for i in range(self.n_shards)]
        return self

    def projected_base(self) -> Path | None:
        """The complete cache of this encoder's backbone *without* its projection, when the projection
        is a bias-free linear map: its shards projected are this encoder's (normalise(W·h) =
        normalise(W·h/|h|); a frozen-backbone projection such as training.e5_projection's is then
        benchmarked without encoding the pool again)."""
        projection = self.encoder.projection
        if projection is None or getattr(projection, "bias", None) is not None:
            return None
        if self._base is None:  # hashing the backbone's weights once (seconds for e5)
            bare = Encoder(self.encoder.backbone, self.encoder.tokenizer,
                           dataclasses.replace(self.encoder.settings, dim=None), None, source=self.encoder.source)
            self._base = self.folder.with_name(self.folder.name.replace(self.encoder.fingerprint()[:12],
                                                                         bare.fingerprint()[:12]))
        complete = all((self._base / f"shard-{i:05d}").exists() for i in range(self.n_shards))
        return self._base if complete else None

    def select(self, indices: Sequence[int]) -> EncodedCorpus:
        """Encoded passages ``indices`` (positions in ``texts``), in that order."""
        parts = []
        for i in indices:
            shard = self._shards[i // SHARD]
            parts.append((shard, i % SHARD))
        # Group consecutive picks from one shard to keep the number of gathers small.
        out, run_shard, run = [], None, []
        for shard, local in parts:
            if shard is not run_shard and run:
                out.append(run_shard.select(run))
                run = []
            run_shard = shard
            run.append(local)
        if run:
            out.append(run_shard.select(run))
        return EncodedCorpus.concat(out) if len(out) > 1 else out[0]


def project_index(source: Path, target: Path, encoder: Encoder, tokens: int = 65536) -> None:
    """Write at ``target`` the version-1 index of ``source`` (the unprojected backbone's) with every
    vector mapped through ``encoder``'s projection and re-normalised; the tables are copied."""
    manifest = read_manifest(source)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(VECTORS, MANIFEST))
    vectors = np.memmap(source / VECTORS, dtype=np.float16, mode="r",
                        shape=(manifest["num_tokens"], manifest["dim"]))
    weight = encoder.projection.weight.detach().float()
    with open(tmp / VECTORS, "wb") as out, torch.inference_mode():
        for lo in range(0, len(vectors), tokens):
            block = torch.from_numpy(np.asarray(vectors[lo:lo + tokens], dtype=np.float32))
            out.write(torch.nn.functional.normalize(block @ weight.T, dim=-1).half().numpy().tobytes())
    write_manifest(tmp, {**manifest, "model": model_block(encoder), "dim": encoder.dim})
    tmp.replace(target)


class SingleVectorEncoder:
    """A sentence embedder by its own recipe: mean pooling, unit length. all-MiniLM-L6-v2 (the default;
    256 tokens) or any Hugging Face folder; ``e5-small``: multilingual-e5-small (agrame.e5) with its
    "query: " / "passage: " prefixes, 512 tokens, specials in the mean as e5 pools."""

    max_length = 256

    def __init__(self, model_path: str | None = None):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from agrame.backbones import E5_SMALL

        hf_logging.set_verbosity_error()
        self.query_prefix = self.passage_prefix = ""
        if model_path == E5_SMALL:
            from agrame.e5 import PASSAGE_PREFIX, QUERY_PREFIX, load_e5

            self.path = E5_SMALL
            self.model, self.tokenizer = load_e5()
            self.query_prefix, self.passage_prefix = QUERY_PREFIX + " ", PASSAGE_PREFIX + " "
            self.max_length = 512
            return
        path = str(model_path or default_model_path())
        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, add_pooling_layer=False).eval()

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 32, query: bool = False) -> np.ndarray:
        """Passage vectors; ``query=True``: query vectors (they differ where the model has prefixes)."""
        prefix = self.query_prefix if query else self.passage_prefix
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            enc = self.tokenizer([prefix + texts[i] for i in idx], truncation=True, max_length=self.max_length,
                                 padding=True, return_tensors="pt", return_token_type_ids=False)
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.encode(texts, batch_size, query=True)

    def fingerprint(self) -> str:
        return "mean-" + hashlib.sha256(self.path.encode()).hexdigest()[:8]


def single_vectors(texts: Sequence[str], name: str, encoder: SingleVectorEncoder | None = None,
                   reverse: bool = False) -> np.ndarray:
    """``[len(texts), 384]`` float16 mean-pooled vectors, cached in shards.

    ``reverse`` walks the shards from the end, so a second process can share the work.
    """
    encoder = encoder or SingleVectorEncoder()
    folder = cache_root() / f"{name}-{encoder.fingerprint()}-{_hash(texts)}"
    folder.mkdir(parents=True, exist_ok=True)
    n_shards = (len(texts) + SHARD * 4 - 1) // (SHARD * 4)
    bar = tqdm(total=len(texts), desc=f"single vectors {name}", unit="txt", disable=None)
    for i in (reversed(range(n_shards)) if reverse else range(n_shards)):
        path = folder / f"shard-{i:05d}.npy"
        lo, hi = i * SHARD * 4, min(len(texts), (i + 1) * SHARD * 4)
        if not path.exists():
            vectors = encoder.encode(texts[lo:hi]).astype(np.float16)
            tmp = folder / f".shard-{i:05d}.tmp-{os.getpid()}.npy"
            np.save(tmp, vectors)
            tmp.replace(path)
        bar.update(hi - lo)
    bar.close()
    shards = [np.load(folder / f"shard-{i:05d}.npy") for i in range(n_shards)]
    return np.concatenate(shards) if shards else np.zeros((0, 384), dtype=np.float16)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", nargs="+", choices=WHAT, default=list(WHAT))
    parser.add_argument("--model", default=None, help="multi-vector model (default: the built-in one)")
    parser.add_argument("--device", default="cpu", help="torch device of the multi-vector model, e.g. cuda")
    parser.add_argument("--reverse", action="store_true",
                        help="single vectors: encode shards from the end (a second process shares the work)")
    args = parser.parse_args(argv)
    pool = load_pool()
    spans = pool_sentences(pool)
    sents, _ = sentence_texts(pool.texts, spans)
    print(f"pool: {len(pool)} passages, {len(sents)} sentences")
    if "colbert" in args.what or "colbert-sentences" in args.what:
        encoder = load_encoder(args.model, device=args.device)
        if "colbert" in args.what:
            MultiVectorCache(encoder, pool.texts, "colbert-pool").ensure()
        if "colbert-sentences" in args.what:
            MultiVectorCache(encoder, sents, "colbert-sentences").ensure()
    if "single-vector" in args.what:
        sv = SingleVectorEncoder()
        single_vectors(pool.texts, "sv-pool", sv, reverse=args.reverse)
        single_vectors(sents, "sv-sentences", sv, reverse=args.reverse)


if __name__ == "__main__":
    main()
