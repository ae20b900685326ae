"""Hostile input against every entry point: no traceback, no 5xx, the documented error shape.

    python -m reliability.hardening flips                  # every single-byte flip of a manifest, 8 ways
    python -m reliability.hardening fuzz --examples 2000   # CLI arguments, passage files, HTTP bodies
    python -m reliability.hardening heavy --clients 4      # concurrent maximum-size /rank against a server

``flips`` and ``fuzz`` run on the tiny test model (a random 2-layer BERT with MiniLM's vocabulary:
what is fuzzed is the input handling, not the model); ``heavy`` serves the default model. The
functions here are also what ``tests/test_hardening.py`` runs at a small budget.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List

from benchmarks.common import command_line, write_result

DAMAGED = "is damaged"


def tiny_index(folder: Path):
    """A small index of the tiny test model with metadata, and the model's folder."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import _make_tiny_encoder

    from agrame.corpus import Passage
    from agrame.index import build_index

    from agrame.loading import load_encoder

    model = folder / "model"
    if not model.exists():
        _make_tiny_encoder().save(model)
    encoder = load_encoder(str(model))  # the index names the folder: commands find the model
    texts = ["Coral reefs are built by polyps. Warm water causes coral bleaching.",
             "The Great Barrier Reef lies off Queensland. It is visible from space.",
             "Marie Curie was born in Warsaw. She won two Nobel prizes.",
             "Bleaching happens when corals expel their algae. Recovery can take years."]
    path = folder / "index"
    build_index(encoder, [Passage(f"p{i}", t, metadata={"n": i, "kind": "reef" if i != 2 else "person"})
                          for i, t in enumerate(texts)], path, progress=False, overwrite=path.exists())
    return path, encoder, model


def flip_sweep(path: Path, encoder, positions=None, masks=(1, 2, 4, 8, 16, 32, 64, 128)) -> dict:
    """Flip each byte of the manifest with each mask: opening must either refuse ('is damaged' /
    not valid JSON / no format) or find the very same manifest (a flip JSON does not see)."""
    from agrame.index import Index, IndexFolderError

    manifest_file = path / "manifest.json"
    original = manifest_file.read_bytes()
    parsed = json.loads(original)
    counts = {"flips": 0, "refused": 0, "same_content": 0, "accepted_damage": 0, "tracebacks": 0}
    examples: List[str] = []
    try:
        for i in positions if positions is not None else range(len(original)):
            for mask in masks:
                data = bytearray(original)
                data[i] ^= mask
                manifest_file.write_bytes(bytes(data))
                counts["flips"] += 1
                try:
                    index = Index(path, model=encoder)
                    index.store.close()
                    try:
                        same = json.loads(bytes(data)) == parsed
                    except ValueError:
                        same = False
                    counts["same_content" if same else "accepted_damage"] += 1
                    if not same and len(examples) < 5:
                        examples.append(f"byte {i} ^ {mask}: accepted")
                except IndexFolderError:
                    counts["refused"] += 1
                except Exception:  # noqa: BLE001 - what the sweep counts
                    counts["tracebacks"] += 1
                    if len(examples) < 5:
                        examples.append(f"byte {i} ^ {mask}: {traceback.format_exc(limit=2)}")
    finally:
        manifest_file.write_bytes(original)
    return {**counts, "examples": examples}


# -- CLI -----------------------------------------------------------------------------------------

NASTY = ["", " ", "-", "--", "\x00", "\x1b[31m", "\u202e", "music \udcff", "\ud800", "é", "a\nb", "../../etc",
         "-1", "0", "1e309", "nan", "{", "{}", "[]", '{"$or": []}', '{"year": {"$gt": true}}', "x" * 300]


def valid_case(rng: random.Random, index: Path, model: Path, files: Dict[str, Path]) -> List[str]:
    """A command line that works, with at most one argument swapped for a hostile one (so the
    fuzzing reaches past argument parsing into the model, index and writers)."""
    m, i = str(model), str(index)
    cases = [["search", "-i", i, "coral reef"], ["search", "-i", i, "-g", "passage", "--filter", '{"n": {"$gte": 1}}',
                                                   "reef"],
             ["search", "-i", i, "-f", "jsonl", "-k", "2", "Warsaw"], ["rank", "-q", "reef", "-p", str(files["txt"]),
                                                                      "-m", m],
             ["explain", "-q", "coral", "-i", i, "--id", "p1"], ["delete", "-i", i, "--missing", "ok", "nope"],
             ["index", "--upsert", "-p", str(files["jsonl2"]), "-i", i], ["compact", "-i", i],
             ["index", "-p", str(files["jsonl2"]), "-i", str(index.parent / "other"), "-m", m, "--overwrite"],
             ["cite", "-a", str(files["txt"]), "-p", str(files["txt"]), "-m", m],
             ["search", "-i", i, "--queries", str(files["queries.tsv"]), "--run", str(index.parent / "run.trec")],
             ["search", "-i", i, "--queries", str(files["queries.jsonl"]), "-f", "jsonl", "-g", "passage"],
             ["evaluate", "--run", str(files["trec"]), "--qrels", str(files["qrels"]), "--measures", "P@1 nDCG@10"],
             ["export", "-m", m, "--format", "pylate", str(index.parent / "exported")]]
    argv = list(rng.choice(cases))
    if rng.random() < 0.7:
        k = rng.randrange(1, len(argv))
        argv[k] = rng.choice(NASTY)
    return argv


def cli_case(rng: random.Random, index: Path, model: Path, files: Dict[str, Path]) -> List[str]:
    """A random command line: a real command with a mix of valid and hostile arguments."""
    if rng.random() < 0.5:
        return valid_case(rng, index, model, files)
    word = lambda: rng.choice(NASTY + ["reef", "coral bleaching", "p1", str(rng.randint(-2, 200))])  # noqa: E731
    place = lambda: str(rng.choice([index, model, *files.values(), index / "nope", files["jsonl"] / "sub"]))  # noqa: E731
    command = rng.choice(["rank", "index", "search", "delete", "compact", "explain", "cite", "evaluate", "export",
                          "bogus"])
    argv = [command]
    options = {
        "rank": [["-q", word()], ["-p", place()], ["-g", word()], ["-k", word()], ["--alpha", word()]],
        "index": [["-p", place()], ["-i", place()], ["--add"], ["--upsert"], ["--overwrite"], ["--nbits", word()],
                  ["--lock-timeout", word()]],
        "search": [[word()], ["-i", place()], ["--filter", word()], ["-k", word()], ["-g", word()], ["-f", word()],
                   ["--queries", place()], ["--run", str(index.parent / f"run-{rng.randint(0, 9)}.trec")],
                   ["--run-tag", word()], ["--batch-size", word()]],
        "evaluate": [["--run", place()], ["--qrels", place()], ["--measures", word()], ["-f", word()]],
        "export": [[str(index.parent / f"export-{rng.randint(0, 9)}")], ["--format", rng.choice(["stanford", "pylate",
                                                                                                  word()])],
                   ["-m", rng.choice([str(model), word()])]],
        "delete": [[word()], ["-i", place()], ["--ids-file", place()], ["--filter", word()], ["--missing", word()]],
        "compact": [["-i", place()], ["--lock-timeout", word()]],
        "explain": [["-q", word()], ["-i", place()], ["--id", word()], ["-p", place()]],
        "cite": [["-a", place()], ["-p", place()], ["--margin", word()]],
        "bogus": [[word()]],
    }[command]
    for option in rng.sample(options, rng.randint(0, len(options))):
        argv += option
    if command in ("search", "explain", "rank", "index"):
        argv += ["-m", str(model)] if command != "search" and rng.random() < 0.8 else []
    return argv


def run_cli(argv: List[str]) -> tuple:
    """(exit code, stderr, traceback or None): argparse's own exit counts as its code."""
    from agrame_app.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception:  # noqa: BLE001 - what the fuzzer counts
            return None, err.getvalue(), traceback.format_exc()
    return code, err.getvalue(), None


def fuzz_cli(examples: int, seed: int, index: Path, model: Path, folder: Path) -> dict:
    rng = random.Random(seed)
    files = _files(folder, rng)
    counts = {"runs": 0, "exit_0": 0, "exit_2": 0, "other_exit": 0, "tracebacks": 0, "bad_message": 0}
    examples_ = []
    for _ in range(examples):
        argv = cli_case(rng, index, model, files)
        before = (index / "manifest.json").read_bytes() if (index / "manifest.json").exists() else None
        # Hostile argv includes bare words as index folders ("-1", "1e309"): run where they land harmlessly.
        with contextlib.chdir(folder):
            code, err, tb = run_cli(argv)
        counts["runs"] += 1
        if tb is not None:
            counts["tracebacks"] += 1
            examples_.append({"argv": [ascii(a) for a in argv], "traceback": tb[-600:]})
        elif code == 0:
            counts["exit_0"] += 1
        elif code == 2:
            counts["exit_2"] += 1
            if not any(line.startswith(("agrame: error:", "usage:", "agrame: ")) for line in err.splitlines()):
                counts["bad_message"] += 1
                examples_.append({"argv": [ascii(a) for a in argv], "stderr": err[-300:]})
        else:
            counts["other_exit"] += 1
            examples_.append({"argv": [ascii(a) for a in argv], "code": code, "stderr": err[-300:]})
        if code not in (0, None) and before is not None and argv[0] in ("index", "delete", "compact") \
                and (index / "manifest.json").read_bytes() != before:
            counts.setdefault("changed_after_refusal", 0)
            counts["changed_after_refusal"] += 1
    return {**counts, "examples": examples_[:5]}


def _files(folder: Path, rng: random.Random) -> Dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    contents = {
        "jsonl": b'{"id": "a", "text": "Reefs grow slowly.", "metadata": {"k": 1}}\n{"id": "b", "text": "x\\ud800"}\n',
        "tsv": b"a\tReefs grow slowly.\nno tab here\n",
        "bad.jsonl": b'{"id": 1, "text": ["x"]}\n{"metadata": {"a": {"b": 1}}, "text": "t"}\n\xff\xfe\n',
        "txt": "Marie Curie was born in Warsaw.\n\u202e evil \x1b[2J\n".encode(),
        "jsonl2": b'{"id": "p1", "text": "Reefs grow slowly.", "metadata": {"k": 1}}\n',
        "ids": b"p1\np9\n\xff\n",
        "queries.tsv": b"q1\tcoral reef\nq2\tWarsaw\n",
        "queries.jsonl": b'{"id": "q1", "text": "reef"}\n{"id": 2, "text": "\\ud800"}\n',
        "trec": b"q1 Q0 p1 1 2.5 t\nq1 Q0 p1#0:18 2 1.0 t\nq2 Q0 p9 1 0.5 t\n",
        "qrels": b"q1 0 p1 1\nq2 0 p2 1\n",
    }
    for name, data in contents.items():
        path = folder / f"input.{name}"
        path.write_bytes(data)
        out[name] = path
    return out


def fuzz_files(examples: int, seed: int) -> dict:
    """Random bytes and near-valid lines as passage files of each format: parsed or refused."""
    from agrame.io import InputError, read_passages

    rng = random.Random(seed)
    pieces = [b'{"id": "a", "text": "t"}', b'{"text": "\\ud800"}', b'{"id": true, "text": "x"}', b"a\tb", b"\t",
              b"\xff", b"\x00", b'{"text": "x", "spans": [[5, 1]]}', b'{"text": "x", "metadata": {"y": NaN}}',
              b'{"text": "x", "metadata": []}', b"[1, 2]", b"{", b"id\ttext\textra", b'"just a string"']
    counts = {"files": 0, "parsed": 0, "refused": 0, "tracebacks": 0}
    examples_ = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(examples):
            fmt = rng.choice(["auto", "jsonl", "tsv", "text"])
            data = b"\n".join(rng.choice(pieces) if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(8))
                              for _ in range(rng.randint(0, 4)))
            path = Path(tmp) / f"f{n}.{rng.choice(['jsonl', 'tsv', 'txt'])}"
            path.write_bytes(data)
            counts["files"] += 1
            try:
                read_passages(str(path), fmt)
                counts["parsed"] += 1
            except InputError:
                counts["refused"] += 1
            except Exception:  # noqa: BLE001
                counts["tracebacks"] += 1
                examples_.append({"data": ascii(data), "traceback": traceback.format_exc()[-600:]})
    return {**counts, "examples": examples_[:5]}


# -- HTTP ----------------------------------------------------------------------------------------

def http_case(rng: random.Random):
    nasty_json = [None, True, 0, -1, 10 ** 12, 1.5, "", "\ud800", "\x1b", "reef", [], {}, ["p1"], {"$or": []},
                  {"n": {"$gt": 1}}, {"kind": "reef"}, "x" * 2000]
    def value():
        return rng.choice(nasty_json)
    path, method = rng.choice([("/search", "POST"), ("/rank", "POST"), ("/cite", "POST"), ("/passages", "POST"),
                               ("/passages", "DELETE"), ("/passages/p1", "GET"), ("/passages/%ED%A0%80", "GET"),
                               ("/nope", "GET"), ("/search", "GET")])
    fields = {"/search": ["query", "granularity", "top_k", "filter", "nprobe", "explain"],
              "/rank": ["query", "passages", "ids", "filter", "granularity", "top_k"],
              "/cite": ["answer", "passages", "margin"],
              "/passages": ["passages", "ids", "filter", "missing"]}.get(path, [])
    body = {f: value() for f in rng.sample(fields, rng.randint(0, len(fields)))}
    if rng.random() < 0.3 and path == "/search":
        body["query"] = rng.choice(["coral", "music \ud800", " "])
    if rng.random() < 0.2 and path in ("/rank", "/cite", "/passages"):
        body["passages"] = [rng.choice([{"id": "p1", "text": "Reef"}, "plain text", {"text": 3}, {"id": "\ud800",
                                                                                              "text": "x"}])]
    raw = None
    if rng.random() < 0.15:
        raw = rng.choice([b"{", b"not json", b"[1,2]", b'"str"', b"\xff\xfe", b"", json.dumps(body).encode()[:-1]])
    return method, path, body, raw


def fuzz_http(examples: int, seed: int, index: Path, model: Path, key: str = "k") -> dict:
    from fastapi.testclient import TestClient

    from agrame_app.serve import create_app

    client = TestClient(create_app(index, model=str(model), allow_writes=True, api_key=key),
                        raise_server_exceptions=False)
    rng = random.Random(seed)
    counts = {"requests": 0, "2xx": 0, "4xx": 0, "5xx": 0, "bad_shape": 0, "changed_after_refusal": 0}
    examples_ = []
    for _ in range(examples):
        method, path, body, raw = http_case(rng)
        before = (index / "manifest.json").read_bytes()
        headers = {"Authorization": f"Bearer {key}"} if rng.random() < 0.5 else {}
        if raw is not None:
            headers["Content-Type"] = rng.choice(["application/json", "text/plain"])
            r = client.request(method, path, content=raw, headers=headers)
        else:
            data = json.dumps(body, ensure_ascii=True).encode()
            r = client.request(method, path, content=data, headers={**headers, "Content-Type": "application/json"})
        counts["requests"] += 1
        bucket = f"{r.status_code // 100}xx"
        counts[bucket] = counts.get(bucket, 0) + 1
        if r.status_code >= 400:
            counts["changed_after_refusal"] += int((index / "manifest.json").read_bytes() != before)
            try:
                ok = isinstance(r.json().get("error"), str) and set(r.json()) == {"error"}
            except ValueError:
                ok = False
            if not ok or r.status_code >= 500:
                counts["bad_shape"] += int(not ok)
                examples_.append({"method": method, "path": path, "body": ascii(body)[:200],
                                  "status": r.status_code, "answer": r.text[:300]})
    return {**counts, "examples": examples_[:5]}


# -- heavy requests -----------------------------------------------------------------------------

def cmd_heavy(args) -> None:
    """Concurrent maximum-size /rank against ``agrame serve`` (default model): 503s instead of
    exhaustion, peak memory, /health latency while the heavy work runs."""
    import http.client
    import os
    import subprocess
    import sys
    import threading

    from benchmarks.common import peak_rss_mb
    from benchmarks.data import load_pool
    from benchmarks.serve_load import _free_port, wait_for_server

    pool = load_pool()
    text = " ".join(pool.texts[:400])[:20_000]
    body = json.dumps({"query": "What causes coral bleaching?", "granularity": "sentence", "top_k": 10,
                       "passages": [{"id": str(i), "text": text} for i in range(100)]})
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "agrame_app.cli", "serve", "--port", str(port)],
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, stderr=subprocess.DEVNULL)
    results, health_ms = [], []
    try:
        wait_for_server(port, server)

        def client(i):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
            t0 = time.perf_counter()
            c.request("POST", "/rank", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            results.append({"status": r.status, "retry_after": r.getheader("Retry-After"),
                            "seconds": round(time.perf_counter() - t0, 1)})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            t0 = time.perf_counter()
            c.request("GET", "/health")
            c.getresponse().read()
            health_ms.append(1000 * (time.perf_counter() - t0))
            time.sleep(1)
        peak = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    health_ms.sort()
    result = {"benchmark": "hardening", "what": "concurrent maximum-size /rank", "clients": args.clients,
              "request": "100 passages × 20,000 characters, sentence top 10", "server_torch_threads": args.threads,
              "statuses": sorted(r["status"] for r in results), "responses": results,
              "server_peak_rss_mb": peak, "health_checks": len(health_ms),
              "health_ms_median": round(health_ms[len(health_ms) // 2], 1) if health_ms else None,
              "health_ms_max": round(health_ms[-1], 1) if health_ms else None}
    out = write_result("hardening-heavy", result, None, command_line("reliability.hardening", ["heavy", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def cmd_flips(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index, encoder, _ = tiny_index(Path(tmp))
        result = flip_sweep(index, encoder)
    result = {"benchmark": "hardening", "what": "single-byte manifest flips", "index": "tiny test model, 4 passages",
              "masks": "each byte XOR 1, 2, 4, …, 128", **result}
    out = write_result("hardening-flips", result, None, command_line("reliability.hardening", ["flips", *args.argv]))
    print(json.dumps(result, indent=1), "→", out)


def cmd_fuzz(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index, _, model = tiny_index(Path(tmp))
        started = time.perf_counter()
        cli = fuzz_cli(args.examples, args.seed, index, model, Path(tmp) / "inputs")
        files = fuzz_files(args.examples, args.seed)
        web = fuzz_http(args.examples, args.seed, index, model)
    result = {"benchmark": "hardening", "what": "fuzz", "seed": args.seed, "examples_each": args.examples,
              "cli": cli, "passage_files": files, "http": web, "seconds": round(time.perf_counter() - started, 1)}
    out = write_result("hardening-fuzz", result, None, command_line("reliability.hardening", ["fuzz", *args.argv]))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "examples"} if isinstance(v, dict) else v
                      for k, v in result.items()}, indent=1), "→", out)


def main(argv=None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flips")
    f.set_defaults(func=cmd_flips)
    z = sub.add_parser("fuzz")
    z.set_defaults(func=cmd_fuzz)
    z.add_argument("--examples", type=int, default=2000)
    z.add_argument("--seed", type=int, default=0)
    h = sub.add_parser("heavy")
    h.set_defaults(func=cmd_heavy)
    h.add_argument("--clients", type=int, default=4)
    h.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.argv = sys.argv[2:] if argv is None else list(argv)[1:]
    args.func(args)


if __name__ == "__main__":
    main()
