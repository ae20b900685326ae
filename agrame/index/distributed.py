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
machine belongs to (``ray start``), ``HEAD:6379`` joins that head's cluster (from one of its nodes;
Ray Client, ``ray://``, is not supported: docs/ray.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from ..corpus import Passage
from .codec import ResidualCodec, codec_from_state
from .format import CODEC_FIELDS, IndexFolderError, model_block
from .lock import build_lock
from .base import BaseIndex, PassageCount
from .sharded import (SearchResults, ShardedWrites, ShardUnavailableError, commit_new, merge_hits, route, shard_of,
                      write_sharded)
from .store import (CompressedBlock, compress_block, default_pool_factor, default_residuals, train_codec,
                    write_blocks)
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


class ClusterBusyError(ValueError):
    """The Ray cluster has no free CPU (or GPU) for an encoder actor."""


def shard_cpus(node_cpus: Sequence[float], shards: int, threads: int = 1) -> float:
    """CPUs each shard actor reserves: its threads where the nodes have them, else a share small enough
    that ``shards`` actors spread over the nodes all fit — ceil(S / nodes) of them on the smallest node
    (8 shards on a 2-CPU machine still all start; they mostly wait on the network and on each other).
    A share of the cluster's total is not enough: 3 shards on two 1-CPU nodes asked 0.667 CPU each, and
    only one fitted on a node."""
    nodes = [c for c in node_cpus if c > 0] or [1.0]
    per_node = -(-shards // len(nodes))
    return min(float(threads), min(nodes) / per_node)


def default_workers(ray, workers: Optional[int] = None, wait: float = 30.0) -> tuple:
    """(actors, GPUs per actor, CPUs per actor): one actor per free GPU, else one per two free CPUs
    (one per CPU on nodes of one CPU); the free CPUs shared evenly among the actors, no actor asking
    for more than the largest node has (torch threads per actor = its CPUs).

    *Free*, not total: actors that live on (a server's shard actors) keep their CPUs, and an actor
    pool sized by the total would wait for them forever. Actors that are ending (a previous pool)
    free theirs within seconds: up to ``wait`` seconds are given for that.
    """
    import time

    deadline = time.monotonic() + wait
    total, free = ray.cluster_resources(), ray.available_resources()
    want = "GPU" if int(total.get("GPU", 0)) else "CPU"
    while free.get(want, 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.25)
        free = ray.available_resources()
    if int(total.get("GPU", 0)):
        gpus = int(free.get("GPU", 0))
        if gpus < 1:
            raise ClusterBusyError(f"the Ray cluster's {int(total['GPU'])} GPUs are all held by other actors")
        return min(workers or gpus, gpus), 1, 1
    cpus = int(free.get("CPU", 0))
    if cpus < 1:
        raise ClusterBusyError(f"the Ray cluster has no free CPU ({total.get('CPU', 0):g} in all, "
                               f"{free.get('CPU', 0):g} free): stop other actors (a running agrame serve "
                               "--ray holds its shard actors) or add nodes")
    # An actor's CPUs must fit on one node: on nodes of 1 CPU each a 2-CPU actor is never placed and the
    # build would wait forever (Ray shows it only as a pending demand).
    largest = max([int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive", True)] or [1])
    largest = max(1, largest)
    actors = min(workers or max(1, cpus // min(2, largest)), cpus)
    return actors, 0, max(1, min(cpus // actors, largest))


class EncodeBlocks:
    """A Ray Data actor: the model loaded once, then blocks of passages → compressed blocks."""

    def __init__(self, model, codec_state: dict, batch_size: int, store_offsets: bool, threads: int,
                 crash_once: Optional[str] = None, pool_factor=1):
        import torch

        torch.set_num_threads(max(1, threads))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.encoder = _encoder(model, device)
        self.codec = codec_from_state(codec_state)
        self.batch_size, self.store_offsets, self.crash_once = batch_size, store_offsets, crash_once
        self.pool_factor = pool_factor

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        payloads = []
        for key, records in zip(batch["key"], batch["passages"]):
            if self.crash_once and not os.path.exists(self.crash_once):
                # Fault injection (tests, benchmarks): this worker process dies in the middle of a block.
                open(self.crash_once, "w").close()
                os._exit(1)
            passages = [_passage(r) for r in json.loads(records)]
            encoded = self.encoder.encode_passages([p.text for p in passages], batch_size=self.batch_size)
            block = compress_block(self.codec, passages, encoded, store_offsets=self.store_offsets,
                                   pool_factor=self.pool_factor)
            payloads.append(pickle.dumps(block, protocol=5))
        return {"key": np.asarray(batch["key"]), "payload": np.array(payloads, dtype=object)}


def _encoder(model, device: str = "cpu"):
    """``model`` as :func:`~agrame.loading.load_encoder` takes it, or an encoder object itself (anything
    with ``encode_passages``, ``fingerprint``, ``source``, ``settings``; e.g. a benchmark's generator)."""
    from ..loading import load_encoder

    if model is None or isinstance(model, (str, Path)):
        return load_encoder(model, device=device)
    return model.to(device) if device != "cpu" and hasattr(model, "to") else model


def _record(p: Passage) -> dict:
    out = {"id": p.id, "text": p.text}
    if p.spans is not None:
        out["spans"] = json.loads(json.dumps(list(p.spans)))
    return out


def _passage(record: dict) -> Passage:
    spans = record.get("spans")
    return Passage(record["id"], record["text"], spans=None if spans is None else tuple(spans))


def _codec_state(codec: ResidualCodec) -> dict:
    return codec.state()


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
                codec = codec_from_state(z)
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
                   workers: Optional[int] = None, shards: Optional[int] = None, nbits=None,
                   batch_size: int = 16, block_passages: int = BLOCK_PASSAGES, overwrite: bool = False,
                   resume: bool = False, codec: Optional[ResidualCodec] = None, seed: int = 0,
                   store_offsets: bool = False, lock_timeout: float = 0.0, progress: bool = True,
                   say: Optional[Callable[[str], None]] = None, crash_once: Optional[str] = None,
                   on_block: Optional[Callable[[str], None]] = None, resource_wait: float = 30.0,
                   pool_factor=None) -> Path:
    """Encode ``passages`` on a Ray cluster into an index at ``path`` (``shards`` > 1: a sharded one).

    ``model``: what :func:`agrame.loading.load_encoder` takes (a folder or shipped name; every actor
    loads it). ``codec``: given centroids and buckets (else trained on a sample, on the driver).

    **When the bytes equal a local build's**: given the same ``codec`` (and passages, model, nbits,
    shards), every file is byte for byte the local build's (tested). Without one, both train the same
    codec from the same sample, but the local build then reuses the sample's encodings while the
    actors encode every passage in their own batches: float vectors ~3e-7 apart, so a handful of
    residual bytes can differ (8 of 6.8 M measured) — the answers are the same, the bytes are not.
    ``resource_wait``: seconds to wait for a free CPU (GPU) before :class:`ClusterBusyError`.
    ``pool_factor``: :mod:`agrame.pooling` (the actors pool each block before compressing it).
    Returns ``path``; the stats of the run are in ``build_with_ray.last_stats``.
    """
    ray = connect(address)
    say = say or (lambda message: None)
    path = Path(path)
    passages = check_passages(passages)
    if not passages:
        raise IndexFolderError("no passages to index")
    _check_target(path, overwrite, resume)
    # The build lock, from before anything is encoded until the commit: a second build of the same path
    # is refused at once instead of both encoding and one replacing the other.
    lock = build_lock(path, lock_timeout)
    lock.acquire()
    try:
        num_shards = shards or 1
        # before anything is written: a busy cluster is refused
        actors, gpus, cpus = default_workers(ray, workers, resource_wait)
        encoder = _encoder(model)
        pool_factor = default_pool_factor(encoder, pool_factor)
        nbits = default_residuals(encoder, nbits)
        model_info = model_block(encoder)
        work = WorkFolder(path)
        fingerprint = _fingerprint(passages, num_shards, block_passages, nbits, model_info,
                                   [store_offsets, pool_factor] if pool_factor != 1 else store_offsets)
        if resume:
            plan, codec = work.resume(fingerprint)
            codec_info = plan["codec_info"]
            say(f"resuming: {len(work.done())} of {plan['num_blocks']} blocks already encoded")
        elif codec is None:
            codec, _, codec_info = train_codec(encoder, passages, nbits, batch_size=batch_size, seed=seed,
                                               progress=progress, pool_factor=pool_factor)
        else:
            codec_info = {"num_centroids": codec.num_centroids, "given": True}
        parts = route(passages, num_shards)
        blocks = [(s, b, part[lo:lo + block_passages]) for s, part in enumerate(parts)
                  for b, lo in enumerate(range(0, len(part), block_passages))]
        if not resume:
            work.start({"fingerprint": fingerprint, "num_blocks": len(blocks)}, codec, codec_info)
        done = work.done()
        todo = [(s, b, part) for s, b, part in blocks if _key(s, b) not in done]
        actors = min(actors, max(1, len(todo)))
        stats = {"blocks": len(blocks), "encoded_blocks": len(todo), "resumed_blocks": len(blocks) - len(todo),
                 "workers": actors, "gpus_per_worker": gpus, "cpus_per_worker": cpus}
        if todo:
            _encode_on_ray(ray, model, codec, todo, work, actors=actors, gpus=gpus, cpus=cpus, batch_size=batch_size,
                           store_offsets=store_offsets, progress=progress, crash_once=crash_once, on_block=on_block,
                           pool_factor=pool_factor)

        write = _writer(work, model_info, codec, codec_info, passages, parts, sharded=bool(shards),
                        block_passages=block_passages, store_offsets=store_offsets, pool_factor=pool_factor)
        commit_new(path, overwrite, write, lock_timeout, held=True)
        work.remove()
        build_with_ray.last_stats = stats
    finally:
        lock.release()
    return path


build_with_ray.last_stats = {}


def _check_target(path: Path, overwrite: bool, resume: bool) -> None:
    """A build may write ``path`` (and the build lock beside it): IndexFolderError otherwise."""
    if path.exists() and any(path.iterdir()) and not overwrite and not resume:
        raise IndexFolderError(f"{path} already exists (use --overwrite to replace it)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # (the build lock lives there)
    except OSError as exc:
        raise IndexFolderError(f"cannot write index {path}: {exc.strerror}") from None


def _writer(work: "WorkFolder", model_info: dict, codec: ResidualCodec, codec_info: dict, passages, parts, *,
            sharded: bool, block_passages: int, store_offsets: bool, pool_factor):
    """What writes the index from the encoded blocks into a temporary folder (``commit_new``'s ``write``)."""
    def blocks_of(shard: int, part):
        return (work.load(_key(shard, b)) for b in range((len(part) + block_passages - 1) // block_passages))

    if sharded:
        return lambda tmp: write_sharded(tmp, model_info, codec, codec_info, parts, blocks_of,
                                         store_offsets=store_offsets, pool_factor=pool_factor)
    return lambda tmp: write_blocks(tmp, model_info, codec, codec_info, passages, blocks_of(0, passages),
                                    store_offsets=store_offsets, pool_factor=pool_factor)


def _encode_on_ray(ray, model, codec: ResidualCodec, todo: List[tuple], work: WorkFolder, *, actors: int, gpus: int,
                   cpus: int, batch_size: int, store_offsets: bool, progress: bool, crash_once: Optional[str],
                   on_block: Optional[Callable[[str], None]], pool_factor=1) -> None:
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
                                               "threads": cpus, "crash_once": crash_once,
                                               "pool_factor": pool_factor})
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


# -- search: one actor per shard -----------------------------------------------------------------


class ShardActor:
    """One shard opened in a Ray actor (restarted by Ray when its process dies). Every call first
    opens the newest committed generation, so writes made through the shared folder are seen."""

    def __init__(self, path: str, model, threads: int = 1, hold: Optional[str] = None):
        import time

        import torch

        from .search import Index

        # Fault drill (tests, benchmarks): while the file ``hold`` exists a (re)starting actor waits,
        # so a restart lasts as long as the drill needs, not as long as a process start happens to.
        deadline = time.monotonic() + 300
        while hold and os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.05)
        torch.set_num_threads(max(1, threads))
        self.index = Index(path, model=model)
        self._crash_next = False

    def ready(self) -> dict:
        """Who answers — after checking that its folder still holds the committed shard (a moved,
        removed or edited folder is an error here, so a health probe sees it as a search would)."""
        import ray

        self.index.reload()
        self.index.check_unchanged()
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def crash_on_next_call(self) -> None:
        """Fault drill: the process dies during its next search (tests, benchmarks)."""
        self._crash_next = True

    def _fresh(self):
        if self._crash_next:
            os._exit(1)
        self.index.reload()
        self.index.check_unchanged()
        return self.index

    def summary(self) -> dict:
        index = self._fresh()
        return {"manifest": index.manifest, "live": len(index)}

    def search_vectors(self, q: np.ndarray, s: Optional[np.ndarray], granularity: str, top_k, filter, options: dict):
        import torch

        index = self._fresh()
        return index.search_vectors(torch.from_numpy(q), None if s is None else torch.from_numpy(s), granularity,
                                    top_k, filter=filter, **options)

    def call(self, method: str, *args, **kwargs):
        return getattr(self._fresh(), method)(*args, **kwargs)


class RayShardedIndex(ShardedWrites, BaseIndex):
    """A sharded index searched by one Ray actor per shard, spread over the cluster; the query is
    encoded once here and its vectors sent to every actor, whose top-k merge by exact score.

    The index folder must be readable at the same path on every node (a shared filesystem), or
    each node must hold the shards its actors open. A shard whose actor dies is restarted by Ray;
    the request it was answering fails with :class:`ShardUnavailableError` (HTTP 503) — never a
    silently partial answer — unless ``allow_partial``: then the hits of the shards that answered,
    with ``missing_shards`` naming the others. A shard that will not come back by itself (its actor
    dead for good, or the live nodes no longer offer what it needs) is reported as lost, not as a
    retry. ``len()`` raises while shards are down; :meth:`count` and :meth:`unavailable` say what is
    missing, since when and why (``/health``). Writes go through :class:`ShardedWriter` on this
    process (the folder must be writable here) and each actor opens the new generation on its next call.

    ``timeout``: seconds a search waits for its shards; ``start_timeout``: for the actors to start (each
    imports torch and loads the model: on a busy machine far longer than a search may wait; default
    ``timeout``); ``probe_timeout``: for counts and health probes, which must answer quickly while a shard
    restarts. ``restart_hold``: a fault drill's file (:class:`ShardActor`).
    """

    def __init__(self, path: Union[str, Path], model=None, *, address: Optional[str] = None,
                 timeout: float = 60.0, threads_per_shard: int = 1,
                 placement: Optional[Sequence[Mapping[str, float]]] = None, probe_timeout: float = 2.0,
                 restart_hold: Optional[str] = None, start_timeout: Optional[float] = None):
        from .format import load_index_model, read_manifest
        from .sharded import read_shards

        ray = connect(address)
        self.ray = ray
        self.path = Path(path).resolve()
        self.shards_manifest = read_shards(self.path)
        self.num_shards = int(self.shards_manifest["num_shards"])
        first = self.path / self.shards_manifest["shards"][0]
        self._model_arg = model
        self.encoder = load_index_model(read_manifest(first), first, model)
        actor_model = None if model is None or not isinstance(model, (str, Path)) else str(model)
        if model is not None and actor_model is None:
            actor_model = self.encoder  # an Encoder object given here: the actors receive it pickled
        remote = ray.remote(max_restarts=-1, max_task_retries=0)(ShardActor)
        self.timeout = timeout
        self.probe_timeout = probe_timeout
        self.placement = None if placement is None else [dict(p) for p in placement]
        #: shard → {"shard", "since", "reason", "permanent"} while it does not answer
        self._down: Dict[int, dict] = {}
        #: shard → its last generation seen (a degraded index's generation does not drop)
        self._generations: Dict[int, int] = {
            i: int(read_manifest(self.path / name).get("generation", 1))
            for i, name in enumerate(self.shards_manifest["shards"])}
        node_cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive", True)]
        cpus = shard_cpus(node_cpus, self.num_shards, threads_per_shard)
        self.actor_cpus = cpus
        if placement is not None and len(placement) != self.num_shards:
            raise ValueError(f"placement: {len(placement)} entries for {self.num_shards} shards")
        # ``placement``: custom resources per shard (e.g. {"node-b": 1}) pin a shard's actor to the node
        # that holds its folder; otherwise Ray spreads the actors over the cluster.
        self.actors = [remote.options(num_cpus=cpus, **({"resources": dict(placement[i])} if placement else
                                                        {"scheduling_strategy": "SPREAD"}))
                       .remote(str(self.path / name), actor_model, threads_per_shard, restart_hold)
                       for i, name in enumerate(self.shards_manifest["shards"])]
        timeout = timeout if start_timeout is None else start_timeout
        try:
            ray.get([a.ready.remote() for a in self.actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            ready, _ = ray.wait([a.ready.remote() for a in self.actors], num_returns=len(self.actors), timeout=1)
            started = set(ready)
            offers = ", ".join(f"{c:g}" for c in node_cpus) or "none"
            free = float(ray.available_resources().get("CPU", 0))
            raise ClusterBusyError(
                f"{self.num_shards - len(started)} of {self.num_shards} shard actors did not start within "
                f"{timeout:g} s: each asks for {cpus:g} CPU, the nodes offer {offers} CPU ({free:g} free); "
                "add nodes or stop other actors") from None

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Block until every shard actor answers (e.g. after Ray restarted one)."""
        import time as _time

        from ray.exceptions import RayActorError

        deadline = _time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                self.ray.get([a.ready.remote() for a in self.actors], timeout=max(0.1, deadline - _time.monotonic()))
                return
            except RayActorError:
                if _time.monotonic() > deadline:
                    raise
                _time.sleep(0.2)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []

    def _gather(self, refs: Dict[int, object], allow_partial: bool, timeout: Optional[float] = None) -> tuple:
        """(results by shard, missing shards): a shard that died or did not answer by the deadline
        (one for all shards, not one each) is missing, and its state noted for :meth:`unavailable`."""
        import time as _time

        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        timeout = self.timeout if timeout is None else timeout
        deadline = _time.monotonic() + timeout
        results, failed = {}, {}
        for s, ref in refs.items():
            try:
                results[s] = self.ray.get(ref, timeout=max(0.0, deadline - _time.monotonic()))
                self._down.pop(s, None)
                manifest = results[s].get("manifest") if isinstance(results[s], dict) else None
                if manifest:
                    self._generations[s] = int(manifest.get("generation", 1))
            except (RayActorError, GetTimeoutError) as exc:
                failed[s] = exc
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (IndexFolderError, OSError)):  # its folder moved, removed or unreadable
                    failed[s] = cause
                elif isinstance(cause, ValueError):  # the request's own fault (a filter, an id): as if local
                    raise cause from None
                else:
                    raise
        for s, exc in failed.items():
            self._note_down(s, exc, timeout)
        missing = sorted(failed)
        if missing and not allow_partial:
            raise self._unavailable_error(missing)
        return results, missing

    def _note_down(self, shard: int, exc: Exception, timeout: float) -> None:
        import time as _time

        from ray.exceptions import ActorDiedError, GetTimeoutError

        before = self._down.get(shard)
        permanent = bool(before and before["permanent"])
        if isinstance(exc, (IndexFolderError, OSError)) and not isinstance(exc, GetTimeoutError):  # (a TimeoutError)
            # said without the server's paths: the shard by name, what is wrong with its folder
            name = self.shards_manifest["shards"][shard]
            said = str(exc).replace(str(self.path / name), name).replace(str(self.path), "the index")
            permanent, reason = True, f"its folder cannot be read ({said})"
        elif isinstance(exc, ActorDiedError) and getattr(exc, "_actor_init_failed", False):
            permanent, reason = True, "its actor failed to open the shard on restart, and Ray will not retry it"
        elif isinstance(exc, ActorDiedError) and self._dead_for_good(shard):
            permanent, reason = True, "its actor is dead and Ray will not restart it"
        else:
            # Ray answers a call to an actor it cannot place in several ways (a timeout, ActorUnavailableError
            # while it restarts, ActorDiedError with its node): whichever, the live nodes decide whether it
            # can come back — the same check for all of them
            short = self._cannot_place(shard)
            if isinstance(exc, GetTimeoutError):
                reason = f"no answer within {timeout:g} s"
                reason += f": {short}" if short else " (its actor is restarting or busy)"
            else:
                reason = f"its actor died: {short}" if short else "its actor died and Ray is restarting it"
            permanent = permanent or bool(short)
        self._down[shard] = {"shard": shard, "since": before["since"] if before else _time.time(),
                             "reason": reason, "permanent": permanent}

    def _dead_for_good(self, shard: int) -> bool:
        """A call that died with its actor does not say whether Ray restarts it; a new call does: it
        fails at once with ``ActorDiedError`` only when the actor is dead for good."""
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        try:
            self.ray.get(self.actors[shard].ready.remote(), timeout=1.0)
        except ActorDiedError:
            return True
        except (GetTimeoutError, RayActorError):
            pass
        return False

    def _cannot_place(self, shard: int) -> str:
        """Why a shard's restarting actor cannot be placed on the live nodes ('' when it can)."""
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive", True)]
        for key in (self.placement[shard] if self.placement else ()):
            if not any(key in n for n in nodes):
                return f"no live node offers the resource {key!r} that it is pinned to"
        cpus = sum(float(n.get("CPU", 0)) for n in nodes)
        need = self.actor_cpus * self.num_shards
        if cpus + 1e-9 < need:
            return (f"the live nodes offer {cpus:g} CPU and the {self.num_shards} shard actors need {need:g}: "
                    "it cannot restart until a node joins")
        return ""

    def _unavailable_error(self, missing: Sequence[int]) -> ShardUnavailableError:
        return ShardUnavailableError.from_states([self._down[s] for s in missing])

    def _all(self, method: str, *args, allow_partial: bool = False, **kwargs) -> tuple:
        return self._gather({s: a.call.remote(method, *args, **kwargs) for s, a in enumerate(self.actors)},
                            allow_partial)

    def _summaries(self, allow_partial: bool) -> tuple:
        """(each answering shard's summary, missing shards), within ``probe_timeout``. With
        ``allow_partial`` the shards already known to be down are not asked again (a health
        probe or a search just asked them) — so a count never waits on a restart."""
        asked = {s: a for s, a in enumerate(self.actors) if not (allow_partial and s in self._down)}
        results, missing = self._gather({s: a.summary.remote() for s, a in asked.items()}, allow_partial,
                                        self.probe_timeout)
        missing = sorted(set(missing) | (set(range(self.num_shards)) - set(asked)))
        if not results:
            raise self._unavailable_error(missing)
        return [results[s] for s in sorted(results)], missing

    def unavailable(self, timeout: Optional[float] = None) -> List[dict]:
        self._gather({s: a.ready.remote() for s, a in enumerate(self.actors)}, True,
                     self.probe_timeout if timeout is None else timeout)
        return [dict(self._down[s]) for s in sorted(self._down)]

    @property
    def manifest(self) -> dict:
        summaries, missing = self._summaries(True)
        ms = [r["manifest"] for r in summaries]
        out = {"format": self.shards_manifest["format"], "model": ms[0]["model"], "num_shards": self.num_shards,
               # every shard's last committed generation seen, those down included: the same number
               # whether degraded or not (the local sharded index's sum of its shards' generations)
               "generation": sum(self._generations.get(s, 1) for s in range(self.num_shards)),
               "has_spans": any(m.get("has_spans") for m in ms),
               "num_passages": sum(int(m["num_passages"]) for m in ms),
               "num_deleted": sum(int(m.get("num_deleted", 0)) for m in ms), "nbits": ms[0].get("nbits"),
               **{k: ms[0][k] for k in CODEC_FIELDS if k in ms[0]},
               "num_tokens": sum(int(m.get("num_tokens", 0)) for m in ms),
               "num_sentences": sum(int(m.get("num_sentences", 0)) for m in ms)}
        if missing:  # counts of the shards that answered only
            out["missing_shards"] = missing
        return out

    def count(self, *, allow_partial: bool = False) -> PassageCount:
        summaries, missing = self._summaries(allow_partial)
        return PassageCount(sum(r["live"] for r in summaries), missing)

    def __len__(self) -> int:
        return int(self.count())

    def _actor(self, passage_id: str):
        return shard_of(passage_id, self.num_shards)

    def get(self, passage_id: str) -> Optional[dict]:
        s = self._actor(passage_id)
        return self._gather({s: self.actors[s].call.remote("get", passage_id)}, False)[0][s]

    def metadata(self, passage_id: str) -> dict:
        s = self._actor(passage_id)
        return self._gather({s: self.actors[s].call.remote("metadata", passage_id)}, False)[0][s]

    def ids(self) -> List[str]:
        results, _ = self._all("ids")
        return [pid for s in range(self.num_shards) for pid in results[s]]

    def encode_query(self, query: str, granularity: str = "sentence"):
        from ..ranker import Ranker
        return Ranker(self.encoder).encode_query(query, granularity)

    def search(self, query: str, granularity: str = "sentence", top_k: Optional[int] = 10, *,
               filter: Optional[Mapping] = None, allow_partial: bool = False, **options) -> SearchResults:
        from .metadata import parse_filter
        from ..ranker import GRANULARITIES

        if not isinstance(query, str) or not query.strip():
            raise ValueError("query is empty")
        if granularity not in GRANULARITIES:
            raise ValueError(f"unknown granularity {granularity!r}; choose one of {', '.join(GRANULARITIES)}")
        if top_k is not None and top_k < 1:
            raise ValueError("top_k must be at least 1")
        if filter is not None:
            parse_filter(filter)
        q, s = self.encode_query(query, granularity)
        return self.search_vectors(q, s, granularity, top_k, filter=filter, allow_partial=allow_partial, **options)

    def search_vectors(self, q, s, granularity: str = "sentence", top_k: Optional[int] = 10, *,
                       filter: Optional[Mapping] = None, allow_partial: bool = False, **options) -> SearchResults:
        """:meth:`search` with the query already encoded (batch search encodes many at once)."""
        qn = q.numpy()
        sn = None if s is None else s.numpy()
        refs = {i: a.search_vectors.remote(qn, sn, granularity, top_k, filter, options)
                for i, a in enumerate(self.actors)}
        results, missing = self._gather(refs, allow_partial)
        return SearchResults(merge_hits([results[i] for i in sorted(results)], top_k), missing)

    def rank_ids(self, query: str, passage_ids: Sequence[str], granularity: str = "sentence",
                 top_k: Optional[int] = 10, *, filter=None, alpha: Optional[float] = None):
        groups: Dict[int, List[str]] = {}
        for pid in passage_ids:
            groups.setdefault(self._actor(pid), []).append(pid)
        refs = {s: self.actors[s].call.remote("rank_ids", query, ids, granularity, top_k, filter=filter, alpha=alpha)
                for s, ids in groups.items()}
        results, _ = self._gather(refs, False)
        return merge_hits(list(results.values()), top_k)

    def explain_all(self, query: str, passage_ids: Sequence[str], alpha: Optional[float] = None) -> list:
        groups: Dict[int, List[str]] = {}
        for pid in passage_ids:
            groups.setdefault(self._actor(pid), []).append(pid)
        refs = {s: self.actors[s].call.remote("explain_all", query, ids, alpha=alpha) for s, ids in groups.items()}
        results, _ = self._gather(refs, False)
        out = {}
        for s, ids in groups.items():
            out.update(zip(ids, results[s]))
        return [out[pid] for pid in passage_ids]

    def explain(self, query: str, passage_id: str, alpha: Optional[float] = None):
        return self.explain_all(query, [passage_id], alpha=alpha)[0]

    def reload(self) -> bool:
        return False  # every actor opens the newest generation on each call
