"""Load test of ``agrame serve`` on loopback: concurrent clients, then the same during an ``--add``.

    python -m benchmarks.serve_load --clients 8 --requests 200

Serves a copy of the pooled-corpus index (``benchmarks.index_search build``) from a separate
process bound to 127.0.0.1, and sends sentence searches (SQuAD dev questions, top 10) from
``--clients`` threads, ``--requests`` each, over keep-alive connections: p50/p99 latency,
throughput, errors, the server's peak memory. The second phase repeats the load while
``agrame index --add`` appends SciFact abstracts to the served index, in rounds until the add has committed and one round after; a response is *mixed*
if its generation and its passage count disagree or it shows an added passage under the
old generation. Both must stay at 0. The third phase repeats the load while a writer loop
goes through HTTP (the server runs with ``--allow-writes`` and an API key): each round upserts
``--write-batch`` new passages and reads each back (*lost*: an acknowledged write not visible
after its commit), then deletes the top hits of a question and two of its own passages
(*returned after delete*: any response — the writer's own search right after the commit, or a
reader's whose generation is at or past the delete's — that still shows a deleted id). Errors,
mixed, lost and returned-after-delete must all be 0.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List

from .common import command_line, data_dir, peak_rss_mb, sample, write_result
from .data import load_pool, load_questions


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(port: int, server: subprocess.Popen, seconds: float = 300) -> dict:
    """``/health`` of a server process once it answers (exits if it dies or never answers)."""
    deadline = time.time() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            return json.loads(conn.getresponse().read())
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("error: server did not start")
            time.sleep(0.5)


def _client(port: int, queries: List[str], n: int, offset: int, out: list, deadline: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(n):
        if time.time() > deadline:
            out.append({"error": "deadline"})
            break
        body = json.dumps({"query": queries[(offset + i) % len(queries)], "granularity": "sentence", "top_k": 10})
        start = time.perf_counter()
        try:
            conn.request("POST", "/search", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
            record = {"ms": 1000 * (time.perf_counter() - start), "status": response.status}
            if response.status == 200:
                record.update(generation=data["generation"], passages=data["passages"],
                              ids=[h["passage_id"] for h in data["results"]])
            out.append(record)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            out.append({"error": repr(exc)})
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.close()


def run_load(port: int, queries: List[str], clients: int, requests: int, seconds: float) -> dict:
    results: List[list] = [[] for _ in range(clients)]
    deadline = time.time() + seconds
    threads = [threading.Thread(target=_client, args=(port, queries, requests, c * requests, results[c], deadline))
               for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    flat = [r for rs in results for r in rs]
    ok = [r for r in flat if r.get("status") == 200]
    ms = sorted(r["ms"] for r in ok)
    pct = lambda p: round(ms[min(len(ms) - 1, int(p / 100 * len(ms)))], 1) if ms else None  # noqa: E731
    return {"requests": len(flat), "ok": len(ok), "errors": len(flat) - len(ok),
            "p50_ms": pct(50), "p99_ms": pct(99), "mean_ms": round(statistics.fmean(ms), 1) if ms else None,
            "throughput_per_s": round(len(ok) / wall, 1), "wall_s": round(wall, 1), "_records": flat}


def _call(conn, method: str, path: str, body=None, key: str = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, None if body is None else json.dumps(body), headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def write_loop(port: int, key: str, queries: List[str], texts: List[str], rounds: int, batch: int, out: dict) -> None:
    """Upserts and deletes through HTTP, each checked right after its commit (see the module doc)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    counts, deleted, errors, lost, returned = {}, {}, 0, 0, 0
    upsert_ms, delete_ms = [], []
    for i in range(rounds):
        passages = [{"id": f"w{i}-{j}", "text": texts[(i * batch + j) % len(texts)], "metadata": {"round": i}}
                    for j in range(batch)]
        t0 = time.perf_counter()
        status, data = _call(conn, "POST", "/passages", {"passages": passages}, key)
        upsert_ms.append(1000 * (time.perf_counter() - t0))
        if status != 200:
            errors += 1
            continue
        counts[data["generation"]] = data["passages"]
        for p in passages:
            status, got = _call(conn, "GET", f"/passages/{p['id']}")
            lost += int(status != 200 or got.get("text") != p["text"] or got["generation"] < data["generation"])
        query = queries[i % len(queries)]
        status, found = _call(conn, "POST", "/search", {"query": query, "granularity": "passage", "top_k": 3})
        if status != 200:
            errors += 1
            continue
        victims = [h["passage_id"] for h in found["results"] if h["passage_id"] not in deleted]
        victims += [passages[0]["id"], passages[1]["id"]] if batch > 1 else []
        t0 = time.perf_counter()
        status, data = _call(conn, "DELETE", "/passages", {"ids": victims}, key)
        delete_ms.append(1000 * (time.perf_counter() - t0))
        if status != 200:
            errors += 1
            continue
        counts[data["generation"]] = data["passages"]
        for v in victims:
            deleted[v] = data["generation"]
        status, again = _call(conn, "POST", "/search", {"query": query, "granularity": "passage", "top_k": 3})
        returned += int(status == 200 and any(h["passage_id"] in deleted for h in again["results"]))
        for v in victims:
            status, _ = _call(conn, "GET", f"/passages/{v}")
            returned += int(status != 404)
    conn.close()
    out.update(rounds=rounds, batch=batch, write_errors=errors, lost=lost, returned_after_delete=returned,
               counts=counts, deleted=deleted, upsert_ms_median=round(statistics.median(upsert_ms), 1) if upsert_ms else None,
               delete_ms_median=round(statistics.median(delete_ms), 1) if delete_ms else None)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="per client and phase")
    parser.add_argument("--add", type=int, default=100, help="SciFact abstracts appended in the second phase")
    parser.add_argument("--nbits", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=900, help="deadline of each phase")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server")
    parser.add_argument("--write-rounds", type=int, default=20, help="upsert + delete rounds of the third phase")
    parser.add_argument("--write-batch", type=int, default=10, help="passages upserted per round")
    args = parser.parse_args(argv)

    from .index_search import PoolVectors

    source = PoolVectors().index_path(args.nbits)
    if not source.exists():
        raise SystemExit(f"error: {source} missing: run python -m benchmarks.index_search build --nbits {args.nbits}")
    queries = [q.text for q in sample(load_questions("squad-dev", load_pool()), 400, 0)]
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "index"
        shutil.copytree(source, served)
        added = Path(tmp) / "added.jsonl"
        with open(data_dir() / "scifact" / "corpus.jsonl") as f, open(added, "w") as out:
            for _, line in zip(range(args.add), f):
                doc = json.loads(line)
                out.write(json.dumps({"id": f"scifact-{doc['doc_id']}", "text": " ".join(doc["sentences"])}) + "\n")
        port = _free_port()
        key = os.urandom(16).hex()
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "AGRAME_API_KEY": key}
        server = subprocess.Popen([sys.executable, "-m", "agrame_app.cli", "serve", "-i", str(served), "--port", str(port),
                                   "--allow-writes"], env=env, stderr=subprocess.PIPE, text=True)
        try:
            health = wait_for_server(port, server)
            run_load(port, queries, 2, 5, 60)  # warm-up
            plain = run_load(port, queries, args.clients, args.requests, args.seconds)
            plain.pop("_records")
            base = health["index"]["passages"]
            adder = subprocess.Popen([sys.executable, "-m", "agrame_app.cli", "index", "--add", "-p", str(added),
                                      "-i", str(served)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                                     stderr=subprocess.PIPE, text=True)
            # Load until the add has committed, then one more round: responses from both generations.
            rounds, records, started = [], [], time.time()
            while True:
                finished = adder.poll() is not None
                rounds.append(run_load(port, queries, args.clients, args.requests, args.seconds))
                records += rounds[-1].pop("_records")
                if finished or time.time() - started > args.seconds:
                    break
            adder_rc = adder.wait(timeout=600)
            ms = sorted(r["ms"] for r in records if r.get("status") == 200)
            ok = len(ms)
            during = {"requests": len(records), "ok": ok, "errors": len(records) - ok, "rounds": len(rounds),
                      "p50_ms": round(ms[int(0.5 * len(ms))], 1) if ms else None,
                      "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None,
                      "throughput_per_s": round(ok / sum(r["wall_s"] for r in rounds), 1)}
            mixed = 0
            for r in records:
                if r.get("status") != 200:
                    continue
                new_ids = any(i.startswith("scifact-") for i in r["ids"])
                expected = base if r["generation"] == health["index"]["generation"] else base + args.add
                if r["passages"] != expected or (new_ids and r["generation"] == health["index"]["generation"]):
                    mixed += 1
            generations = sorted({r["generation"] for r in records if r.get("status") == 200})
            during.update(mixed=mixed, generations_seen=generations, add_exit_code=adder_rc,
                          responses_after_add=sum(1 for r in records if r.get("generation", 0) > generations[0]))
            writes = _write_phase(port, key, queries, added, args)
            peak = peak_rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    result = {"benchmark": "serve_load", "index": f"pooled corpus, {args.nbits}-bit ({base:,} passages)",
              "clients": args.clients, "requests_per_client": args.requests, "request": "POST /search sentence top 10",
              "server_torch_threads": args.threads, "added_passages": args.add, "plain": plain, "during_add": during,
              "during_writes": writes,
              "server_peak_rss_mb": peak, "model": health["model"], "sample": {"questions": len(queries)}}
    path = write_result("serve_load", result, None, command_line("benchmarks.serve_load", argv))
    print(json.dumps(result, indent=1), "→", path)


def _write_phase(port: int, key: str, queries: List[str], added: Path, args) -> dict:
    texts = [json.loads(line)["text"] for line in added.read_text().splitlines()]
    writer: dict = {}
    thread = threading.Thread(target=write_loop, args=(port, key, queries[200:], texts, args.write_rounds,
                                                      args.write_batch, writer))
    records, rounds = [], []
    thread.start()
    while True:
        finished = not thread.is_alive()
        rounds.append(run_load(port, queries, args.clients, args.requests, args.seconds))
        records += rounds[-1].pop("_records")
        if finished:
            break
    thread.join()
    counts, deleted = writer.pop("counts"), writer.pop("deleted")
    ok = [r for r in records if r.get("status") == 200]
    ms = sorted(r["ms"] for r in ok)
    mixed = sum(1 for r in ok if r["generation"] in counts and r["passages"] != counts[r["generation"]])
    returned = sum(1 for r in ok if any(deleted.get(i, 1 << 60) <= r["generation"] for i in r["ids"]))
    return {"requests": len(records), "ok": len(ok), "errors": len(records) - len(ok), "rounds_of_load": len(rounds),
            "p50_ms": round(ms[int(0.5 * len(ms))], 1) if ms else None,
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None,
            "mixed": mixed, "readers_returned_after_delete": returned,
            "responses_checked_against_known_generation": sum(1 for r in ok if r["generation"] in counts),
            "generations_seen": len({r["generation"] for r in ok}), **writer}


if __name__ == "__main__":
    main()
