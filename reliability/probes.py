"""Issue 40's hostile probes, rerun: nothing lost, nothing touched, nothing silently wrong, no 5xx.

    python -m reliability.probes race --trials 20      # concurrent fresh builds of one new path
    python -m reliability.probes layouts               # commands on folders holding a copied manifest.json
    python -m reliability.probes meta-flips --flips 100  # one-bit flips inside meta.sqlite's stored values
    python -m reliability.probes bounds                # wide/deep filters, deep JSON, oversize and heavy HTTP

All on the tiny test model (a random 2-layer BERT with MiniLM's vocabulary: what is probed is the
storage and input handling, not the model); each writes ``benchmarks/results/safety-<probe>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.common import command_line, write_result

from .corpus import TEXTS
from .hardening import tiny_index



def _corpus(folder: Path, tag: str, n: int, metadata: bool = False) -> Path:
    rng = random.Random(tag)
    file = folder / f"{tag}.jsonl"
    with open(file, "w") as f:
        for i in range(n):
            record = {"id": f"{tag}-{i}", "text": f"{TEXTS[i % 6]} Item {i} of {tag}."}
            if metadata:
                record["metadata"] = {"source": rng.choice(["wiki", "news", "blog"]), "year": rng.randint(1990, 2024),
                                      "tags": rng.sample(["reef", "fish", "coast", "algae"], 2)}
            f.write(json.dumps(record) + "\n")
    return file


def _agrame(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agrame_app.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def _traceback(text: str) -> bool:
    return "Traceback (most recent call last)" in text


# -- race ------------------------------------------------------------------------------------------

def run_race(trials: int, folder: Path, model: Path, passages: int = 300) -> dict:
    """``agrame index -p A -i X & agrame index -p B -i X`` (B with ``--overwrite`` in every other
    trial): a silent loss is a build that exited 0 whose corpus is not what X holds, unless the other
    build replaced it afterwards with ``--overwrite`` and said so (exit 0)."""
    from agrame.index import Index

    files = {tag: _corpus(folder, tag, passages) for tag in "ab"}
    out = {"trials": trials, "silent_losses": 0, "losers_exit_2": 0, "both_succeeded": 0, "tracebacks": 0,
           "other": 0, "examples": []}
    for trial in range(trials):
        target = folder / f"x{trial}"
        overwrite = trial % 2 == 1
        argv = {tag: ["index", "-p", str(files[tag]), "-i", str(target), "--model", str(model)]
                + (["--overwrite"] if overwrite and tag == "b" else []) for tag in "ab"}
        procs = {tag: subprocess.Popen([sys.executable, "-m", "agrame_app.cli", *argv[tag]], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for tag in "ab"}
        done = {}
        for tag, p in procs.items():
            stdout, stderr = p.communicate(timeout=600)
            done[tag] = (p.returncode, stderr, time.monotonic())
        holds = {i.split("-")[0] for i in Index(target, model=str(model)).ids()}
        whole = len(Index(target, model=str(model))) == passages and len(holds) == 1
        codes = {tag: done[tag][0] for tag in "ab"}
        out["tracebacks"] += sum(_traceback(done[t][1]) for t in "ab")
        if sorted(codes.values()) == [0, 2]:
            winner = "a" if codes["a"] == 0 else "b"
            out["losers_exit_2"] += 1
            if holds != {winner} or not whole:
                out["silent_losses"] += 1
                out["examples"].append({"trial": trial, "codes": codes, "holds": sorted(holds)})
        elif codes == {"a": 0, "b": 0}:
            out["both_succeeded"] += 1
            # only fine when b replaced a afterwards with --overwrite
            if not (overwrite and holds == {"b"} and whole and done["b"][2] >= done["a"][2]):
                out["silent_losses"] += 1
                out["examples"].append({"trial": trial, "codes": codes, "holds": sorted(holds)})
        else:
            out["other"] += 1
            out["examples"].append({"trial": trial, "codes": codes, "stderr": {t: done[t][1][-300:] for t in "ab"}})
        if len(out["examples"]) > 10:
            out["examples"] = out["examples"][:10]
    out["leftovers"] = sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock"))
    return out


# -- layouts ---------------------------------------------------------------------------------------

LAYOUT_FILES = {
    "thesis": {"s1/thesis.tex": "\\chapter{Reefs}\n" * 200},
    "passages": {"passages.jsonl": "x" * 80_000},
    "both": {"s1/thesis.tex": "draft\n" * 50, "passages.jsonl": "y" * 80_000},
    "store-names": {"codes.bin": "z" * 5_000, "centroids.f16": "c" * 10, "s2/notes.md": "mine"},
    "meta": {"meta.sqlite": "not a database", "notes/a.txt": "a"},
}


def run_layouts(folder: Path, model: Path) -> dict:
    """Folders that are not indexes but hold a copied ``manifest.json`` (of a plain, a compacted and a
    metadata-less index), each with user files; and real indexes with a user's folder inside. Every
    command on them; a user file touched is a failure."""
    from agrame.corpus import Passage
    from agrame.loading import load_encoder
    from agrame.index import Index, build_index

    encoder = load_encoder(str(model))
    sources = {}
    for kind in ("plain", "compacted", "no-metadata"):
        path = folder / f"src-{kind}"
        build_index(encoder, [Passage(f"p{i}", t, metadata=None if kind == "no-metadata" else {"source": "wiki"})
                              for i, t in enumerate(TEXTS)], path, progress=False)
        if kind == "compacted":
            index = Index(path, model=encoder)
            index.delete(["p1"], compact_threshold=None)
            index.compact()
        sources[kind] = path
    corpus = _corpus(folder, "c", 3)
    commands = {"overwrite": ["index", "--overwrite", "-p", str(corpus), "-m", str(model)],
                "add": ["index", "--add", "-p", str(corpus), "-m", str(model)],
                "upsert": ["index", "--upsert", "-p", str(corpus), "-m", str(model)],
                "delete": ["delete", "--missing", "ok", "x"],
                "delete-filter": ["delete", "--filter", '{"source": "wiki"}'],
                "compact": ["compact"],
                "search": ["search", "coral", "-m", str(model)]}
    out = {"layouts": 0, "commands": 0, "touched": 0, "exit_0": 0, "tracebacks": 0, "examples": []}
    for kind, src in sources.items():
        for name, files in LAYOUT_FILES.items():
            layout = folder / f"{kind}-{name}"
            layout.mkdir()
            shutil.copy(src / "manifest.json", layout / "manifest.json")
            for rel, text in files.items():
                (layout / rel).parent.mkdir(parents=True, exist_ok=True)
                (layout / rel).write_text(text)
            out["layouts"] += 1
            before = _snapshot(layout)
            for cname, argv in commands.items():
                argv = list(argv)
                argv[1:1] = ["-i", str(layout)]
                r = _agrame(*argv)
                out["commands"] += 1
                out["exit_0"] += r.returncode == 0
                out["tracebacks"] += _traceback(r.stderr)
                if _snapshot(layout) != before:
                    out["touched"] += 1
                    out["examples"].append({"layout": layout.name, "command": cname, "stderr": r.stderr[-300:]})
                    before = _snapshot(layout)
    # real indexes with a user's folders inside: the index may change, the user's files may not
    for n, inside in enumerate((["s3"], ["s1", "s2"], ["s9", "notes"], ["s1"], ["s4", "s5"])):
        path = folder / f"real-{n}"
        shutil.copytree(sources["plain"], path)
        for name in inside:
            (path / name).mkdir()
            (path / name / "thesis.tex").write_text(f"mine {n}")
        out["layouts"] += 1
        for cname, argv in (("overwrite", commands["overwrite"]), ("delete", ["delete", "p2"]),
                            ("compact", ["compact"]), ("upsert", commands["upsert"])):
            argv = list(argv)
            argv[1:1] = ["-i", str(path)]
            r = _agrame(*argv)
            out["commands"] += 1
            out["tracebacks"] += _traceback(r.stderr)
            if any(not (path / name / "thesis.tex").is_file() or (path / name / "thesis.tex").read_text() != f"mine {n}"
                   for name in inside):
                out["touched"] += 1
                out["examples"].append({"layout": path.name, "command": cname, "stderr": r.stderr[-300:]})
    return out


# -- meta.sqlite flips -----------------------------------------------------------------------------

def run_meta_flips(flips: int, folder: Path, model: Path, seed: int = 0, passages: int = 2000) -> dict:
    """One-bit flips inside stored values of ``meta.sqlite`` (metadata values and ids, found by their
    bytes), each on a fresh copy: the index must refuse to open naming the file, or answer exactly as
    before (a flip in a byte no query reads); a different answer is a silent failure."""
    from agrame.index import Index, IndexFolderError

    rng = random.Random(seed)
    src = folder / "src"
    r = _agrame("index", "-p", str(_corpus(folder, "m", passages, metadata=True)), "-i", str(src), "-m", str(model))
    assert r.returncode == 0, r.stderr
    filters = [{"source": "wiki"}, {"year": {"$gte": 2010}}, {"tags": "reef"}, {"$or": [{"source": "blog"},
                                                                                           {"year": 1999}]}]

    def answers(path: Path):
        index = Index(path, model=str(model))
        out = [[h.passage_id for h in index.search("coral reef", "passage", top_k=50, filter=f, exact=True)]
               for f in filters]
        out.append([index.get(f"m-{i}") for i in range(0, passages, 97)])
        out.append(sorted(index.ids()))
        return out

    reference = answers(src)
    data = (src / "meta.sqlite").read_bytes()
    needles = [b"wiki", b"news", b"blog", b"reef", b"algae", b'"year": 20', b"m-1", b"m-5"]
    offsets = sorted({at + k for needle in needles for at in _find_all(data, needle) for k in range(len(needle))})
    out = {"flips": 0, "refused_naming_file": 0, "same_answers": 0, "silently_different": 0, "other_errors": 0,
           "candidate_bytes": len(offsets), "examples": []}
    for _ in range(flips):
        at = rng.choice(offsets)
        bit = 1 << rng.randrange(8)
        copy = folder / "flip"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(src, copy)
        meta = copy / "meta.sqlite"
        raw = bytearray(meta.read_bytes())
        raw[at] ^= bit
        meta.write_bytes(bytes(raw))
        out["flips"] += 1
        try:
            got = answers(copy)
        except IndexFolderError as exc:
            if "meta.sqlite" in str(exc):
                out["refused_naming_file"] += 1
            else:
                out["other_errors"] += 1
                out["examples"].append({"offset": at, "bit": bit, "error": str(exc)[:200]})
            continue
        except Exception as exc:  # noqa: BLE001 - a probe counts what escapes
            out["other_errors"] += 1
            out["examples"].append({"offset": at, "bit": bit, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        if got == reference:
            out["same_answers"] += 1
        else:
            out["silently_different"] += 1
            out["examples"].append({"offset": at, "bit": bit, "what": "different answers"})
    return out


def _find_all(data: bytes, needle: bytes) -> List[int]:
    found, at = [], data.find(needle)
    while at >= 0:
        found.append(at)
        at = data.find(needle, at + 1)
    return found


# -- bounds ----------------------------------------------------------------------------------------

def _filters() -> Dict[str, str]:
    return {"or-992": json.dumps({"$or": [{"f": i} for i in range(992)]}),
            "and-1000": json.dumps({"$and": [{"f": {"$ne": i}} for i in range(1000)]}),
            "25-fields-in-10000": json.dumps({f"k{j}": {"$in": list(range(10_000))} for j in range(25)}),
            "not-5000-deep": '{"$not": ' * 5000 + '{"a": 1}' + "}" * 5000,
            "list-5000-deep": '{"a": {"$in": ' + "[" * 5000 + "]" * 5000 + "}}"}


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_bounds(folder: Path, model: Path, index: Path) -> dict:
    import http.client

    from benchmarks.serve_load import _free_port, wait_for_server

    out: Dict[str, dict] = {"cli": {"cases": 0, "tracebacks": 0, "exit_not_2": 0, "examples": []},
                            "http": {"cases": 0, "5xx": 0, "wrong_shape": 0, "tracebacks_logged": 0, "statuses": {},
                                     "examples": []}}
    deep = "[" * 5000 + "]" * 5000
    pfile = folder / "deep.jsonl"
    pfile.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y", "metadata": ' + deep + "}\n")
    qfile = folder / "deep-q.jsonl"
    qfile.write_text('{"id": "q", "text": "coral", "x": ' + deep + "}\n")
    big = folder / "big.jsonl"
    big.write_text(json.dumps({"id": "a", "text": "reef " * 1_700_000}) + "\n")  # 8.5 MB
    # (a filter of over 128 KiB cannot be one argument of a command on Linux: those go over HTTP only)
    argv_filters = [f for f in _filters().values() if len(f) < 100_000]
    out["cli"]["filters_too_long_for_argv"] = len(_filters()) - len(argv_filters)
    cases = [["search", "-i", str(index), "--filter", f, "coral"] for f in argv_filters]
    cases += [["delete", "-i", str(index), "--filter", f] for f in argv_filters]
    cases += [["rank", "-q", "coral", "-p", str(pfile)], ["index", "-p", str(pfile), "-i", str(folder / "ix-deep")],
              ["search", "-i", str(index), "--queries", str(qfile)], ["index", "-p", str(big), "-i", str(folder / "ix-big")],
              ["rank", "-q", "reef", "-p", str(big)]]
    for argv in cases:
        r = _agrame(*argv)
        cli = out["cli"]
        cli["cases"] += 1
        cli["tracebacks"] += _traceback(r.stderr)
        if r.returncode != 2:
            cli["exit_not_2"] += 1
            cli["examples"].append({"argv": [a[:60] for a in argv], "exit": r.returncode, "stderr": r.stderr[-300:]})
    port = _free_port()
    log = folder / "server.log"
    with open(log, "w") as server_log:
        server = subprocess.Popen([sys.executable, "-m", "agrame_app.cli", "serve", "-i", str(index), "-m", str(model),
                                   "--port", str(port)], stdout=server_log, stderr=server_log,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for_server(port, server)

        def request(method: str, path: str, body, headers=None, timeout: float = 120):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            try:
                c.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
                r = c.getresponse()
                data = r.read()
                return r.status, data
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                return None, str(exc).encode()

        def check(name: str, status, data: bytes) -> None:
            h = out["http"]
            h["cases"] += 1
            h["statuses"][str(status)] = h["statuses"].get(str(status), 0) + 1
            if status is None or status >= 500 and status != 503:
                h["5xx"] += 1
                h["examples"].append({"case": name, "status": status, "body": data[:200].decode("utf-8", "replace")})
            if status is not None and status >= 400:
                try:
                    shape_ok = set(json.loads(data)) <= {"error", "missing_shards"}
                except ValueError:
                    shape_ok = False
                if not shape_ok:
                    h["wrong_shape"] += 1
                    h["examples"].append({"case": name, "status": status, "body": data[:200].decode("utf-8", "replace")})

        for name, f in _filters().items():
            check(f"search {name}", *request("POST", "/search", '{"query": "coral", "filter": ' + f + "}"))
            check(f"rank-ids {name}", *request("POST", "/rank", '{"query": "coral", "ids": ["p0"], "filter": ' + f + "}"))
        check("deep body", *request("POST", "/search", "[" * 100_000 + "]" * 100_000))
        check("invalid utf-8", *request("POST", "/search", b'{"query": "\xff"}'))
        check("10 MB query", *request("POST", "/search", json.dumps({"query": "q" * 10_000_000})))
        # memory: idle, then 4 concurrent 100 MB bodies and 4 concurrent maximum-size /rank bodies
        request("POST", "/search", json.dumps({"query": "coral"}))
        idle = _rss_mb(server.pid)
        peak = [idle]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_mb(server.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        hundred = b'{"query": "' + b"q" * (100 << 20) + b'"}'
        # the largest /rank body accepted: 100 passages × 20,000 characters, each escaped (6 bytes a character)
        escaped = "\\u00e9" * 20_000
        max_rank = ('{"query": "coral", "top_k": 101, "passages": ['
                    + ", ".join(f'"{escaped}"' for _ in range(100)) + "]}").encode()
        results = []

        def send(body, path):
            results.append((path, *request("POST", path, body, timeout=300)))

        for body, path in ((hundred, "/search"), (max_rank, "/rank")):
            threads = [threading.Thread(target=send, args=(body, path)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        stop.set()
        sampler.join()
        for path, status, data in results:
            check(f"concurrent body {path}", status, data)
        # heavy searches: 20 at once
        heavy = json.dumps({"query": "coral reef bleaching", "granularity": "passage", "top_k": 100, "nprobe": 1024,
                            "ncandidates": 8192, "explain": True})
        timings = []

        def heavy_one():
            t0 = time.perf_counter()
            status, data = request("POST", "/search", heavy, timeout=60)
            timings.append(time.perf_counter() - t0)
            results.append(("/search heavy", status, data))

        results.clear()
        threads = [threading.Thread(target=heavy_one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for path, status, data in results:
            check(path, status, data)
        timings.sort()
        out["http"]["heavy_searches"] = {"requests": 20, "statuses": sorted(str(s) for _, s, _ in results),
                                         "seconds_median": round(timings[len(timings) // 2], 2),
                                         "seconds_max": round(timings[-1], 2)}
        out["memory"] = {"idle_rss_mb": round(idle, 1), "peak_rss_mb": round(peak[0], 1),
                         "ratio": round(peak[0] / idle, 3),
                         "requests": "4 concurrent 100 MB /search bodies, then 4 concurrent maximum-size /rank bodies "
                                     f"({len(max_rank):,} bytes, refused after parsing: top_k 101)"}
    finally:
        server.terminate()
        server.wait(timeout=30)
    out["http"]["tracebacks_logged"] = log.read_text().count("Traceback (most recent call last)")
    return out


def run_toggle(seconds: float, folder: Path, model: Path, mapped: int = 200) -> dict:
    """Issue 62's race, as it was found: a served index (uvicorn on loopback), one byte of a passage's text
    flipped and restored every ~0.5 ms (``os.pwrite``) while ``GET /passages/ID`` runs for ``seconds``; then
    ``mapped`` edits of a random byte of a random store file through a shared memory map, each read back. An
    *edited* answer is a 200 whose body differs from the committed one: it must never happen."""
    import http.client
    import mmap

    from agrame.corpus import Passage
    from agrame.index import build_index
    from agrame.index.format import read_manifest, store_root
    from agrame.loading import load_encoder
    from agrame_app.serve import create_app
    from benchmarks.browser_check import Server

    from .edits import toggling

    path = folder / "toggle-ix"
    build_index(load_encoder(str(model)), [Passage(f"t{i}", f"{TEXTS[i % 6]} Item {i}.") for i in range(30)], path,
                progress=False)
    root = store_root(path, read_manifest(path))
    data = (root / "passages.jsonl").read_bytes()
    at = data.find(b"Item 7.") + 1  # a letter of passage t7's text
    counts = {"200": 0, "503": 0, "edited": 0, "other": 0}
    with Server(create_app(path, model=str(model))) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)

        def get(pid: str):
            conn.request("GET", f"/passages/{pid}")
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read())

        truth = get("t7")[1]
        deadline = time.monotonic() + seconds
        with toggling(root / "passages.jsonl", at, 0x20, period=0.0005):
            while time.monotonic() < deadline:
                status, body = get("t7")
                key = "edited" if status == 200 and body != truth else str(status) if status in (200, 503) else "other"
                counts[key] += 1
        rng = random.Random(0)
        files = [f for f in sorted(root.iterdir()) if f.is_file() and f.stat().st_size and f.suffix in (".jsonl", ".bin")]
        ids = [f"t{i}" for i in range(30)]
        truths = {pid: get(pid)[1] for pid in ids}
        edits = {"cases": 0, "503": 0, "200 unchanged": 0, "edited": 0, "served again": 0}
        for _ in range(mapped):
            file = rng.choice(files)
            spot, mask = rng.randrange(file.stat().st_size), 1 << rng.randrange(8)
            pid = rng.choice(ids)
            with open(file, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                m[spot] = m[spot]  # (no msync: the page stays dirty, so the edit below leaves mtime alone)
                get(pid)
                m[spot] ^= mask
                status, body = get(pid)
                m[spot] ^= mask
            edits["cases"] += 1
            edits["503" if status == 503 else "edited" if body != truths[pid] else "200 unchanged"] += 1
            edits["served again"] += get(pid) == (200, truths[pid])
    return {"toggle": {"seconds": seconds, "requests": sum(counts.values()), **counts},
            "mapped_edits": edits, "failures": counts["edited"] + counts["other"] + edits["edited"]
            + edits["cases"] - edits["served again"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="probe", required=True)
    race = sub.add_parser("race", help="concurrent fresh builds of one new path")
    race.add_argument("--trials", type=int, default=20)
    race.add_argument("--passages", type=int, default=300)
    sub.add_parser("layouts", help="every command on folders holding a copied manifest.json")
    flips = sub.add_parser("meta-flips", help="one-bit flips inside meta.sqlite's stored values")
    flips.add_argument("--flips", type=int, default=100)
    flips.add_argument("--seed", type=int, default=0)
    sub.add_parser("bounds", help="wide/deep filters, deep JSON, oversize bodies, heavy searches")
    toggle = sub.add_parser("toggle", help="a byte flipped every ~0.5 ms under a served index, and edits through "
                                           "a shared map: never an edited 200 (issue 62)")
    toggle.add_argument("--seconds", type=float, default=60.0)
    toggle.add_argument("--mapped", type=int, default=200)
    suite = sub.add_parser("suite", help="the standing suite: fuzz, kill, tamper (reliability.standing); CI's size "
                                         "unless --minutes")
    suite.add_argument("--seed", type=int, default=None, help="(default: from the clock; printed first)")
    suite.add_argument("--minutes", type=float, default=None, help="the long run: counts scaled to about this long")
    suite.add_argument("--only", nargs="+", choices=["fuzz", "kill", "tamper", "reads"], default=None)
    suite.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    suite.add_argument("--out", default=None, help="result file (default: benchmarks/results/safety-suite.json "
                                                   "for --minutes, none for CI's size)")
    args = parser.parse_args(argv)
    if args.probe == "suite":
        raise SystemExit(_suite(args, argv))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        index, _, model = tiny_index(tmp)
        if args.probe == "race":
            result = run_race(args.trials, tmp, model, args.passages)
        elif args.probe == "layouts":
            result = run_layouts(tmp, model)
        elif args.probe == "meta-flips":
            result = run_meta_flips(args.flips, tmp, model, args.seed)
        elif args.probe == "toggle":
            result = run_toggle(args.seconds, tmp, model, args.mapped)
        else:
            result = run_bounds(tmp, model, index)
    result = {"benchmark": "safety", "probe": args.probe, "model": "tiny test model", **result,
              "seconds": round(time.perf_counter() - started, 1)}
    out = write_result(f"safety-{args.probe}", result, None, command_line("reliability.probes", argv))
    print(json.dumps(result, indent=1)[:4000], "→", out)


def _suite(args, argv) -> int:
    from .standing import CI_COUNTS, LONG_PER_MINUTE, run_suite

    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    counts = dict(CI_COUNTS) if args.minutes is None else \
        {k: max(CI_COUNTS[k], int(v * args.minutes)) for k, v in LONG_PER_MINUTE.items()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_suite(Path(args.work or tmp), seed, counts, args.only)
    result = {"benchmark": "safety-suite", "model": "tiny test model", **result,
              "seconds": round(time.perf_counter() - started, 1)}
    print(f"suite: {result['failures']} failures in {result['seconds']} s (seed {seed})")
    if args.out or args.minutes is not None:
        out = write_result("safety-suite", result, args.out, command_line("reliability.probes", argv))
        print("→", out)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    main()
