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
from agrame.index.store import train_codec
from agrame.index.writer import build_compressed

from test_lifecycle import _passages

STORE_FILES = ("codes.bin", "residuals.bin", "doclens.bin", "sentcounts.bin", "sentences.bin",
               "sentence_tokens.bin", "passages.jsonl", "passage_offsets.bin", "centroids.f16", "buckets.f32")


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


def test_a_pooled_ray_build_equals_the_local_pooled_build(ray_cluster, tmp_path, tiny_encoder, tiny_model_dir, codec):
    # the actors pool each block before compressing it, as the local build does (agrame.pooling)
    passages = _corpus()
    build_sharded(tiny_encoder, passages, tmp_path / "local", 2, codec=codec, chunk_passages=4, progress=False,
                  pool_factor=2)
    build_with_ray(tiny_model_dir, passages, tmp_path / "ray", shards=2, codec=codec, block_passages=4,
                   progress=False, pool_factor=2)
    for s in range(2):
        local, ray = tmp_path / "local" / f"shard-{s:03d}", tmp_path / "ray" / f"shard-{s:03d}"
        _same_store(local, ray)
        for name in ("pool.bin", "origlens.bin"):
            assert (local / name).read_bytes() == (ray / name).read_bytes()
        manifest = read_manifest(ray)
        assert manifest["pool_factor"] == 2 and manifest["num_tokens"] < manifest["num_original_tokens"]


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


def test_cli_index_on_ray(ray_cluster, tmp_path, tiny_model_dir, coral_file, capsys):
    from agrame_app.cli import main

    ix = tmp_path / "cli-ray"
    assert main(["index", "-p", str(coral_file), "-i", str(ix), "-m", str(tiny_model_dir), "--ray",
                 "--shards", "2", "--workers", "1"]) == 0
    assert "(2 shards)" in capsys.readouterr().err
    assert len(ShardedIndex(ix)) == 4
    assert main(["index", "-p", str(coral_file), "-i", str(tmp_path / "other"), "-m", str(tiny_model_dir), "--ray",
                 "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


@pytest.fixture(scope="module")
def ray_sharded(ray_cluster, tmp_path_factory, tiny_encoder, tiny_model_dir, codec):
    from agrame.index.distributed import RayShardedIndex

    path = tmp_path_factory.mktemp("ray-sharded") / "sh"
    build_sharded(tiny_encoder, _corpus(), path, 3, codec=codec, progress=False)
    # restart_hold: while this file exists a restarting shard actor waits (the health drill below)
    index = RayShardedIndex(path, model=str(tiny_model_dir), timeout=60, restart_hold=str(path.parent / "hold"))
    yield index, ShardedIndex(path, model=tiny_encoder)
    index.close()


def _key(hits):
    return [(h.passage_id, h.start, h.end, round(h.score, 4)) for h in hits]


def test_shard_actors_answer_like_local_shards(ray_sharded):
    remote, local = ray_sharded
    for g in ("passage", "sentence"):
        for kw in ({"exact": True}, {}):
            a = remote.search("coral bleaching", g, top_k=6, **kw)
            assert _key(a) == _key(local.search("coral bleaching", g, top_k=6, **kw)) and not a.partial
    assert remote.search("reef", "passage", top_k=20, filter={"nothing": 1}) == []
    assert remote.get("r3") == local.get("r3") and len(remote) == len(local) == 20
    assert sorted(remote.ids()) == sorted(local.ids())
    ranked = remote.rank_ids("coral", ["r1", "r2", "r5"], "passage", top_k=None)
    assert _key(ranked) == _key(local.rank_ids("coral", ["r1", "r2", "r5"], "passage", top_k=None))


def test_a_dead_shard_actor_is_a_clear_error_or_a_declared_partial_answer(ray_sharded):
    from agrame.index.sharded import ShardUnavailableError

    remote, local = ray_sharded
    full = _key(remote.search("tower in Paris", "passage", top_k=20))
    remote.ray.get(remote.actors[1].crash_on_next_call.remote())
    with pytest.raises(ShardUnavailableError, match="shard 1 did not answer"):
        remote.search("tower in Paris", "passage", top_k=20)
    # Ray restarts the actor (meanwhile its shard answers 503 too); once up, requests are whole again.
    remote.wait_ready()
    assert _key(remote.search("tower in Paris", "passage", top_k=20)) == full
    remote.ray.get(remote.actors[1].crash_on_next_call.remote())
    partial = remote.search("tower in Paris", "passage", top_k=20, allow_partial=True)
    assert partial.missing_shards == [1]
    shard1 = set(local.shards[1].ids())
    assert not {h.passage_id for h in partial} & shard1
    assert _key(partial) == [k for k in full if k[0] not in shard1]
    remote.wait_ready()


def test_writes_through_the_folder_reach_the_actors(ray_sharded):
    remote, _ = ray_sharded
    remote.upsert([Passage("late-1", "Glaciers retreat as the climate warms.")])
    assert remote.get("late-1")["text"].startswith("Glaciers")
    remote.delete(["late-1"])
    assert remote.get("late-1") is None and len(remote) == 20


def test_serve_answers_503_for_a_dead_shard_and_partial_on_request(ray_sharded, tiny_model_dir):
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    remote, _ = ray_sharded
    client = TestClient(create_app(remote, model=str(tiny_model_dir)))
    ok = client.post("/search", json={"query": "coral", "granularity": "passage", "top_k": 5})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 5 and "missing_shards" not in ok.json()
    remote.ray.get(remote.actors[0].crash_on_next_call.remote())
    down = client.post("/search", json={"query": "coral", "granularity": "passage", "top_k": 5})
    assert down.status_code == 503 and "shard 0" in down.json()["error"] and down.headers["Retry-After"]
    assert down.json()["missing_shards"] == [0]
    remote.wait_ready()
    remote.ray.get(remote.actors[0].crash_on_next_call.remote())
    part = client.post("/search", json={"query": "coral", "granularity": "passage", "top_k": 5,
                                        "allow_partial": True})
    assert part.status_code == 200 and part.json()["missing_shards"] == [0] and part.json()["partial"] is True
    remote.wait_ready()
    health = client.get("/health").json()["index"]
    assert health["format"] == "agrame-sharded/1" and health["passages"] == 20


def test_health_is_degraded_while_a_shard_restarts_and_ok_again_after(ray_sharded, tiny_model_dir):
    from fastapi.testclient import TestClient

    from agrame.index.sharded import ShardUnavailableError
    from agrame_app.serve import create_app

    remote, _ = ray_sharded
    client = TestClient(create_app(remote, model=str(tiny_model_dir)))
    ok = client.get("/health")
    assert ok.status_code == 200 and ok.json()["status"] == "ok" and ok.json()["index"]["partial"] is False
    assert ok.json()["index"]["passages"] == 20 and "unavailable" not in ok.json()["index"]
    hold = remote.path.parent / "hold"
    hold.touch()
    try:
        remote.ray.get(remote.actors[2].crash_on_next_call.remote())
        assert client.post("/search", json={"query": "coral", "granularity": "passage"}).status_code == 503
        down = client.get("/health")  # the actor waits on the hold file: shard 2 is down, not "ok"
        body = down.json()
        assert down.status_code == 503 and body["status"] == "degraded" and down.headers["Retry-After"]
        assert [d["shard"] for d in body["index"]["unavailable"]] == [2]
        state = body["index"]["unavailable"][0]
        assert state["permanent"] is False and state["since"].endswith("Z") and state["down_s"] >= 0
        assert "shard 2 did not answer" in body["error"] and "retry" in body["error"]
        # the count of the others is marked partial; len() refuses to pass a part for the whole
        shard2 = len(ShardedIndex(remote.path).shards[2])
        assert body["index"]["partial"] is True and body["index"]["passages"] == 20 - shard2
        count = remote.count(allow_partial=True)
        assert count == 20 - shard2 and count.partial and count.missing_shards == [2]
        with pytest.raises(ShardUnavailableError, match="shard 2"):
            len(remote)
    finally:
        hold.unlink()
    remote.wait_ready()
    again = client.get("/health")
    assert again.status_code == 200 and again.json()["status"] == "ok" and again.json()["index"]["passages"] == 20
    assert len(remote) == 20 and not remote.count().partial and remote.unavailable() == []


def test_a_build_on_a_cluster_whose_cpus_are_held_is_a_clear_error(ray_sharded, tmp_path, tiny_model_dir, codec):
    from agrame.index.distributed import ClusterBusyError

    # The shard actors above hold the cluster's 2 CPUs; an encoder pool sized by the total would wait forever.
    with pytest.raises(ClusterBusyError, match="no free CPU"):
        build_with_ray(tiny_model_dir, _corpus(), tmp_path / "busy", codec=codec, progress=False,
                       resource_wait=2)
    assert not (tmp_path / "busy").exists()


class _FakeRay:
    """What default_workers reads of a cluster: totals, what is free, and each node's CPUs."""

    def __init__(self, nodes, free):
        self._nodes, self._free = nodes, free

    def cluster_resources(self):
        return {"CPU": float(sum(self._nodes))}

    def available_resources(self):
        return {"CPU": float(self._free)}

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": float(n)}} for n in self._nodes]


def test_actor_sizes_fit_the_nodes_not_the_cluster_total():
    from agrame.index.distributed import default_workers

    # two nodes of one CPU each: two actors of one CPU (a 2-CPU actor would wait forever)
    assert default_workers(_FakeRay([1, 1], 2), wait=0) == (2, 0, 1)
    assert default_workers(_FakeRay([1, 1, 1], 3), workers=1, wait=0) == (1, 0, 1)
    # one node of two (or more): as before, one actor per two CPUs
    assert default_workers(_FakeRay([2], 2), wait=0) == (1, 0, 2)
    assert default_workers(_FakeRay([4, 4], 8), wait=0) == (4, 0, 2)
    assert default_workers(_FakeRay([8], 8), workers=2, wait=0) == (2, 0, 4)


def test_shard_actor_sizes_let_every_shard_fit():
    import math

    from agrame.index.distributed import shard_cpus

    for nodes, shards in (([1, 1], 3), ([1, 1], 2), ([2], 8), ([1, 1], 5), ([4, 1], 4), ([16], 2)):
        cpus = shard_cpus(nodes, shards)
        assert sum(math.floor(n / cpus + 1e-9) for n in nodes) >= shards, (nodes, shards, cpus)
        assert cpus <= 1
    assert shard_cpus([1, 1], 3) == 0.5 and shard_cpus([16], 2, threads=4) == 4


def test_a_moved_shard_folder_is_a_503_naming_the_shard_without_a_traceback(ray_sharded, tiny_model_dir):
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    remote, _ = ray_sharded
    client = TestClient(create_app(remote, model=str(tiny_model_dir)), raise_server_exceptions=False)
    before = client.get("/health").json()
    assert before["status"] == "ok"
    folder = remote.path / remote.shards_manifest["shards"][2]
    folder.rename(folder.with_name("moved-away"))
    try:
        for answer in (client.post("/search", json={"query": "coral", "granularity": "passage"}),
                       client.get("/health")):
            text = answer.text
            assert answer.status_code == 503, text
            assert "shard 2" in answer.json()["error"] and "shard-002" in answer.json()["error"], text
            for leak in ("Traceback", "\\u001b", "\x1b", str(remote.path), "ActorID", "ray::"):
                assert leak not in text, (leak, text)
        health = client.get("/health").json()
        assert health["index"]["unavailable"][0]["permanent"] is True
        assert health["index"]["generation"] == before["index"]["generation"]  # one meaning, degraded or not
    finally:
        folder.with_name("moved-away").rename(folder)
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/search", json={"query": "coral", "granularity": "passage"}).status_code == 200


def test_a_shard_lost_for_good_is_reported_as_lost_not_as_a_retry(ray_sharded, tiny_model_dir):
    """Last of the module's shard tests: it kills an actor for good."""
    from fastapi.testclient import TestClient

    from agrame.index.sharded import ShardUnavailableError
    from agrame_app.serve import create_app

    remote, _ = ray_sharded
    client = TestClient(create_app(remote, model=str(tiny_model_dir)))
    remote.ray.kill(remote.actors[1], no_restart=True)
    with pytest.raises(ShardUnavailableError, match="shard 1 lost.*will not") as lost:
        remote.search("coral", "passage")
    assert lost.value.permanent and "retry, or" not in str(lost.value)
    search = client.post("/search", json={"query": "coral", "granularity": "passage"})
    assert search.status_code == 503 and search.json()["permanent"] is True and "Retry-After" not in search.headers
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded" and "Retry-After" not in health.headers
    assert health.json()["index"]["unavailable"][0]["permanent"] is True and "lost" in health.json()["error"]


def test_a_restart_the_live_nodes_cannot_hold_is_a_loss():
    """After a node loss the shard actors may no longer fit what the live nodes offer: Ray would
    keep them pending forever, so a timeout then is reported as a loss, naming the shortfall."""
    from ray.exceptions import GetTimeoutError

    from agrame.index.distributed import RayShardedIndex

    index = RayShardedIndex.__new__(RayShardedIndex)
    index.num_shards, index.actor_cpus, index.placement, index._down = 3, 0.5, None, {}
    index.ray = _FakeRay([1, 1], 2)
    index._note_down(2, GetTimeoutError(), 2.0)
    assert index._down[2]["permanent"] is False and "restarting" in index._down[2]["reason"]
    index.ray = _FakeRay([1], 1)  # one node left: 1 CPU for 3 × 0.5
    since = index._down[2]["since"]
    index._note_down(2, GetTimeoutError(), 2.0)
    state = index._down[2]
    assert state["permanent"] and "offer 1 CPU" in state["reason"] and "need 1.5" in state["reason"]
    assert state["since"] == since  # since the first failure, not the last
    err = index._unavailable_error([2])
    assert err.permanent and "shard 2 lost" in str(err)
    index.placement, index._down = [{"node-a": 1}, {"node-b": 1}, {"node-b": 1}], {}
    index.ray = _FakeRay([2, 2], 4)
    index._note_down(1, GetTimeoutError(), 2.0)
    assert index._down[1]["permanent"] and "'node-b'" in index._down[1]["reason"]
