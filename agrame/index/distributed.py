"""Index builds on a Ray cluster: Ray Data feeds blocks of passages to an actor pool of encoders.

Encoding is nearly all of a build's cost, so it is what runs on the cluster: each actor loads the
model once (on its own GPU when the cluster has GPUs, else on CPU threads), encodes a block of
passages and compresses it with the one codec the driver trained on a sample and handed to every
actor (:func:`agrame.index.store.compress_block`: codes and residuals travel, ~40 bytes per token,
not 512-byte float vectors). The driver keeps each finished block in a work folder beside the index
(``.NAME.ray-build/``) and, once all are in, appends them in passage order into a new index folder
(one shard or several, :mod:`agrame.index.sharded`) that one rename puts in place: no half index is
ever visible. A block whose actor dies is retried by Ray (Data's actor pools restart actors and
retry their tasks); a driver that dies leaves the finished blocks, and ``resume=True`` encodes only
the others. With the same codec, passage order and block size as a local build's chunks, the bytes
are the same as the local build's.

``address``: ``None`` / ``"local"`` starts Ray on this machine, ``"auto"`` joins the cluster this
machine belongs to (``ray start``), ``ray://HOST:10001`` connects a client to a remote head.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from ..corpus import Passage
from .codec import ResidualCodec
from .format import IndexFolderError, model_block
from .sharded import commit_new, route, write_sharded
from .store import CompressedBlock, compress_block, train_codec, write_blocks
from .writer import check_passages

#: Passages per block: the unit of work of an actor, of a retry and of a resume (an unsharded
#: local build's chunk is 1,024 passages: equal sizes give equal bytes).
BLOCK_PASSAGES = 1024
WORK_SUFFIX = ".ray-build"
RAY_EXTRA = "pip install 'agrame[ray]'"
#: Environment of every worker process: one BLAS thread per CPU the actor was given (set in the
#: actor) — several torch processes on few cores otherwise oversubscribe them.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class RayUnavailableError(ValueError):
    """Ray is not installed (a usage error: the message says how to install it)."""


def check_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise RayUnavailableError(f"--ray needs Ray Data ({RAY_EXTRA}): {exc}") from None
    return ray


def connect(address: Optional[str] = None, *, num_cpus: Optional[int] = None, quiet: bool = True):
    """Join (or start) the Ray cluster once per process; returns the ``ray`` module."""
    ray = check_ray()
    if ray.is_initialized():
        return ray
    runtime_env = {"env_vars": dict(WORKER_ENV)}
    if address in (None, "", "local"):
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env, log_to_driver=not quiet,
                 configure_logging=not quiet)
    else:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=not quiet)
    return ray


def default_workers(ray) -> tuple:
    """(actors, GPUs per actor, CPUs per actor): one actor per GPU, else one per two CPUs."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return gpus, 1, 1
    cpus = int(resources.get("CPU", 1))
    return max(1, cpus // 2), 0, min(2, cpus)


class EncodeBlocks:
    """A Ray Data actor: the model loaded once, then blocks of passages → compressed blocks."""

    def __init__(self, model, codec_state: dict, batch_size: int, store_offsets: bool, threads: int,
                 crash_once: Optional[str] = None):
        import torch

        from ..encoder import load_encoder

        torch.set_num_threads(max(1, threads))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.encoder = load_encoder(model, device=device)
        self.codec = ResidualCodec(**codec_state)
        self.batch_size, self.store_offsets, self.crash_once = batch_size, store_offsets, crash_once

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        payloads = []
        for key, records in zip(batch["key"], batch["passages"]):
            if self.crash_once and not os.path.exists(self.crash_once):
                # Fault injection (tests, benchmarks): this worker process dies in the middle of a block.
                open(self.crash_once, "w").close()
                os._exit(1)
            passages = [_passage(r) for r in json.loads(records)]
            encoded = self.encoder.encode_passages([p.text for p in passages], batch_size=self.batch_size)
            block = compress_block(self.codec, passages, encoded, store_offsets=self.store_offsets)
            payloads.append(pickle.dumps(block, protocol=5))
        return {"key": np.asarray(batch["key"]), "payload": np.array(payloads, dtype=object)}


def _record(p: Passage) -> dict:
    out = {"id": p.id, "text": p.text}
    if p.spans is not None:
        out["spans"] = json.loads(json.dumps(list(p.spans)))
    return out


def _passage(record: dict) -> Passage:
    spans = record.get("spans")
    return Passage(record["id"], record["text"], spans=None if spans is None else tuple(spans))


def _codec_state(codec: ResidualCodec) -> dict:
    return {"centroids": codec.centroids, "cutoffs": codec.cutoffs, "weights": codec.weights, "nbits": codec.nbits}


def _fingerprint(passages: Sequence[Passage], shards: int, block: int, nbits: int, model: dict,
                 store_offsets: bool) -> str:
    h = hashlib.sha256(json.dumps([shards, block, nbits, model, store_offsets], sort_keys=True).encode())
    for p in passages:
        h.update(json.dumps(_record(p), ensure_ascii=False).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


class WorkFolder:
    """``.NAME.ray-build/`` beside the index: the plan, the codec and every finished block."""

    def __init__(self, path: Path):
        self.root = path.parent / f".{path.name}{WORK_SUFFIX}"
        self.blocks = self.root / "blocks"

    def start(self, plan: dict, codec: ResidualCodec, codec_info: dict) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        self.blocks.mkdir(parents=True)
        np.savez(self.root / "codec.npz", **_codec_state(codec))
        (self.root / "plan.json").write_text(json.dumps({**plan, "codec_info": codec_info}))

    def resume(self, fingerprint: str):
        try:
            plan = json.loads((self.root / "plan.json").read_text())
            with np.load(self.root / "codec.npz") as z:
                codec = ResidualCodec(z["centroids"], z["cutoffs"], z["weights"], int(z["nbits"]))
        except (OSError, ValueError, KeyError) as exc:
            raise IndexFolderError(f"{self.root}: nothing to resume ({exc}); build without --resume") from None
        if plan.get("fingerprint") != fingerprint:
            raise IndexFolderError(f"{self.root}: an unfinished build of other passages or settings; "
                                   "build without --resume to start over")
        return plan, codec

    def done(self) -> set:
        return {f.stem for f in self.blocks.glob("*.pkl")} if self.blocks.is_dir() else set()

    def save(self, key: str, payload: bytes) -> None:
        tmp = self.blocks / f".{key}.tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.blocks / f"{key}.pkl")

    def load(self, key: str) -> CompressedBlock:
        with open(self.blocks / f"{key}.pkl", "rb") as f:
            return pickle.load(f)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _key(shard: int, block: int) -> str:
    return f"{shard:04d}-{block:07d}"


def build_with_ray(model, passages: Sequence[Passage], path: Union[str, Path], *, address: Optional[str] = None,
                   workers: Optional[int] = None, shards: Optional[int] = None, nbits: int = 2,
                   batch_size: int = 16, block_passages: int = BLOCK_PASSAGES, overwrite: bool = False,
                   resume: bool = False, codec: Optional[ResidualCodec] = None, seed: int = 0,
                   store_offsets: bool = False, lock_timeout: float = 0.0, progress: bool = True,
                   say: Optional[Callable[[str], None]] = None, crash_once: Optional[str] = None,
                   on_block: Optional[Callable[[str], None]] = None) -> Path:
    """Encode ``passages`` on a Ray cluster into an index at ``path`` (``shards`` > 1: a sharded one).

    ``model``: what :func:`agrame.encoder.load_encoder` takes (a folder or shipped name; every actor
    loads it). ``codec``: given centroids and buckets (else trained on a sample, on the driver).
    Returns ``path``; the stats of the run are in ``build_with_ray.last_stats``.
    """
    from ..encoder import load_encoder

    ray = connect(address)
    say = say or (lambda message: None)
    path = Path(path)
    passages = check_passages(passages)
    if not passages:
        raise IndexFolderError("no passages to index")
    if path.exists() and any(path.iterdir()) and not overwrite and not resume:
        raise IndexFolderError(f"{path} already exists (use --overwrite to replace it)")
    num_shards = shards or 1
    encoder = load_encoder(model)
    model_info = model_block(encoder)
    work = WorkFolder(path)
    fingerprint = _fingerprint(passages, num_shards, block_passages, nbits, model_info, store_offsets)
    if resume:
        plan, codec = work.resume(fingerprint)
        codec_info = plan["codec_info"]
        say(f"resuming: {len(work.done())} of {plan['num_blocks']} blocks already encoded")
    else:
        if codec is None:
            codec, _, codec_info = train_codec(encoder, passages, nbits, batch_size=batch_size, seed=seed,
                                               progress=progress)
        else:
            codec_info = {"num_centroids": codec.num_centroids, "given": True}
    parts = route(passages, num_shards)
    blocks = [(s, b, part[lo:lo + block_passages]) for s, part in enumerate(parts)
              for b, lo in enumerate(range(0, len(part), block_passages))]
    if not resume:
        work.start({"fingerprint": fingerprint, "num_blocks": len(blocks)}, codec, codec_info)
    done = work.done()
    todo = [(s, b, part) for s, b, part in blocks if _key(s, b) not in done]
    actors, gpus, cpus = default_workers(ray)
    actors = min(workers or actors, max(1, len(todo)))
    stats = {"blocks": len(blocks), "encoded_blocks": len(todo), "resumed_blocks": len(blocks) - len(todo),
             "workers": actors, "gpus_per_worker": gpus, "cpus_per_worker": cpus}
    if todo:
        _encode_on_ray(ray, model, codec, todo, work, actors=actors, gpus=gpus, cpus=cpus, batch_size=batch_size,
                       store_offsets=store_offsets, progress=progress, crash_once=crash_once, on_block=on_block)

    def blocks_of(shard: int, part):
        return (work.load(_key(shard, b)) for b in range((len(part) + block_passages - 1) // block_passages))

    if shards:
        write = lambda tmp: write_sharded(tmp, model_info, codec, codec_info, parts, blocks_of,  # noqa: E731
                                          store_offsets=store_offsets)
    else:
        write = lambda tmp: write_blocks(tmp, model_info, codec, codec_info, passages, blocks_of(0, passages),  # noqa: E731
                                         store_offsets=store_offsets)
    commit_new(path, overwrite, write, lock_timeout)
    work.remove()
    build_with_ray.last_stats = stats
    return path


build_with_ray.last_stats = {}


def _encode_on_ray(ray, model, codec: ResidualCodec, todo: List[tuple], work: WorkFolder, *, actors: int, gpus: int,
                   cpus: int, batch_size: int, store_offsets: bool, progress: bool, crash_once: Optional[str],
                   on_block: Optional[Callable[[str], None]]) -> None:
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = False
    if isinstance(model, Path):
        model = str(model)
    items = [{"key": _key(s, b), "passages": json.dumps([_record(p) for p in part], ensure_ascii=False)}
             for s, b, part in todo]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(EncodeBlocks, batch_size=1, concurrency=actors, num_gpus=gpus or None, num_cpus=cpus,
                        batch_format="numpy",
                        fn_constructor_kwargs={"model": model, "codec_state": _codec_state(codec),
                                               "batch_size": batch_size, "store_offsets": store_offsets,
                                               "threads": cpus, "crash_once": crash_once})
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=sum(len(part) for _, _, part in todo), desc="encoding (ray)", unit="psg", disable=None)
    sizes = {_key(s, b): len(part) for s, b, part in todo}
    try:
        for row in ds.iter_rows():
            key = str(row["key"])
            work.save(key, row["payload"])
            if bar is not None:
                bar.update(sizes[key])
            if on_block is not None:
                on_block(key)
    finally:
        if bar is not None:
            bar.close()
