"""Ray: a local cluster (started here; if Ray cannot start these tests fail, they never skip),
distributed build == local build with the same codec, retried blocks, resume, shard actors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agrame.corpus import Passage
from agrame.index import Index, IndexFolderError, read_manifest
from agrame.index.distributed import WORK_SUFFIX, build_with_ray, connect
from agrame.index.sharded import ShardedIndex, build_sharded
from agrame.index.store import build_compressed, train_codec

from test_lifecycle import _passages

STORE_FILES = ("codes.bin", "residuals.bin", "doclens.bin", "sentcounts.bin", "sentences.bin",
               "sentence_tokens.bin", "passages.jsonl", "passage_offsets.bin", "centroids.f16", "buckets.f32",
               "ivf-1.offsets.bin", "ivf-1.pids.bin")


@pytest.fixture(scope="module")
def ray_cluster():
    ray = connect(None, num_cpus=2)
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2
    yield ray
    ray.shutdown()


def _corpus(n: int = 20):
    return [Passage(f"r{i}", f"Passage {i} of the test. " + p.text, spans=((0, 7),) if i % 3 == 0 else None)
            for i, p in enumerate(_passages(n, meta=False))]


@pytest.fixture(scope="module")
def codec(tiny_encoder):
    return train_codec(tiny_encoder, _corpus(), 2)[0]


def _same_store(a: Path, b: Path) -> None:
    for name in STORE_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = read_manifest(a), read_manifest(b)
    for key in ("num_passages", "num_tokens", "num_sentences", "has_spans", "num_centroids"):
        assert ma[key] == mb[key], key
    assert ma["model"]["fingerprint"] == mb["model"]["fingerprint"]


def test_distributed_build_equals_local_build(ray_cluster, tmp_path, tiny_encoder, tiny_model_dir, codec):
    passages = _corpus()
    build_compressed(tiny_encoder, passages, tmp_path / "local", codec=codec, chunk_passages=6, progress=False)
    build_with_ray(tiny_model_dir, passages, tmp_path / "ray", workers=2, codec=codec, block_passages=6,
                   progress=False)
    assert build_with_ray.last_stats["blocks"] == 4 and build_with_ray.last_stats["workers"] == 2
    _same_store(tmp_path / "local", tmp_path / "ray")
    assert not (tmp_path / f".ray{WORK_SUFFIX}").exists()
    hits = Index(tmp_path / "ray", model=tiny_encoder).search("coral bleaching", "sentence", top_k=5)
    assert hits == Index(tmp_path / "local", model=tiny_encoder).search("coral bleaching", "sentence", top_k=5)


def test_distributed_sharded_build_equals_local_sharded_build(ray_cluster, tmp_path, tiny_encoder, tiny_model_dir,
                                                              codec):
    passages = _corpus()
    build_sharded(tiny_encoder, passages, tmp_path / "local", 3, codec=codec, chunk_passages=4, progress=False)
    build_with_ray(tiny_model_dir, passages, tmp_path / "ray", shards=3, codec=codec, block_passages=4,
                   progress=False)
    for s in range(3):
        _same_store(tmp_path / "local" / f"shard-{s:03d}", tmp_path / "ray" / f"shard-{s:03d}")
    a, b = ShardedIndex(tmp_path / "local", model=tiny_encoder), ShardedIndex(tmp_path / "ray", model=tiny_encoder)
    assert a.search("tower in Paris", "passage", top_k=5, exact=True) == \
        b.search("tower in Paris", "passage", top_k=5, exact=True)


def test_a_killed_worker_has_its_block_retried(ray_cluster, tmp_path, tiny_encoder, tiny_model_dir, codec):
    passages = _corpus()
    marker = tmp_path / "crashed"
    build_with_ray(tiny_model_dir, passages, tmp_path / "ray", workers=1, codec=codec, block_passages=6,
                   progress=False, crash_once=str(marker))
    assert marker.exists()  # a worker process died mid-block …
    build_compressed(tiny_encoder, passages, tmp_path / "local", codec=codec, chunk_passages=6, progress=False)
    _same_store(tmp_path / "local", tmp_path / "ray")  # … and its block was encoded again, nothing lost


def test_an_interrupted_build_resumes_from_finished_blocks(ray_cluster, tmp_path, tiny_encoder, tiny_model_dir,
                                                          codec):
    passages = _corpus()
    seen = []

    def stop_after_two(key):
        seen.append(key)
        if len(seen) == 2:
            raise KeyboardInterrupt  # the driver dies

    with pytest.raises(KeyboardInterrupt):
        build_with_ray(tiny_model_dir, passages, tmp_path / "ray", workers=1, codec=codec, block_passages=6,
                       progress=False, on_block=stop_after_two)
    assert not (tmp_path / "ray").exists()  # no half index
    assert len(list((tmp_path / f".ray{WORK_SUFFIX}" / "blocks").glob("*.pkl"))) == 2
    with pytest.raises(IndexFolderError, match="other passages"):
        build_with_ray(tiny_model_dir, passages[:-1], tmp_path / "ray", workers=1, block_passages=6,
                       progress=False, resume=True)
    build_with_ray(tiny_model_dir, passages, tmp_path / "ray", workers=1, block_passages=6, progress=False,
                   resume=True)
    assert build_with_ray.last_stats["resumed_blocks"] == 2 and build_with_ray.last_stats["encoded_blocks"] == 2
    build_compressed(tiny_encoder, passages, tmp_path / "local", codec=codec, chunk_passages=6, progress=False)
    _same_store(tmp_path / "local", tmp_path / "ray")
