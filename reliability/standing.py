"""The standing safety suite (issue 52): every parser fuzzed, writers killed, stores tampered with —
seeded, time-boxed, on every change (CI runs the small size), reproducible from the printed seed.

    python -m reliability.probes suite                      # CI's size: ≥ 2,000 fuzz cases, ≥ 50 kills,
                                                           # ≥ 50 tamper cases, well under 5 minutes
    python -m reliability.probes suite --minutes 30         # the long run (counts in the report)
    python -m reliability.probes suite --seed 1234 --only tamper     # one failure, again

Invariants, one per part:

- **fuzz**: passage files (JSONL / TSV / text; encodings, depth, sizes), filters (also checked
  against a plain-Python evaluation of the same filter), query, run and qrels files, the command
  line, every HTTP endpoint's body, path and query string. A case is accepted, or refused with exit
  2 / a 4xx in the ``{"error"}`` shape whose message names the file or field; never a traceback, a
  5xx or a change to the index (hashed before and after).
- **kill**: SIGKILL at a random moment of add, upsert, delete, compact, ``--overwrite``, a fresh
  build and a sharded upsert/delete (a writer in a child of a fork server that loaded the model once: `clean_fork`),
  and a full disk (``RLIMIT_FSIZE``) at a random size during add/upsert: the index opens, every file
  passes its checksum, and its content (ids, texts, metadata, generation) and exact top-k equal the
  state before or after; the next writer's recovery leaves nothing the manifest does not name.
- **reads** (issue 62): a random byte of a served index edited through a shared memory map (no stat change), or
  flipped and restored every ~0.3 ms by a writer racing the reads: every answer is the committed one or a 503
  naming the file, and once put back the same answers come with 200, no restart; a full disk (``RLIMIT_FSIZE``
  0 in such a child) during a fresh open, searches, reads, a server's delete and upsert and their lock takes:
  reads answer, writes are 507 naming a file, and the next write (no limit) takes the lock and succeeds.
  Read-only mounts need a mount namespace: ``tests/test_mounts.py`` mounts them (``unshare``).
- **tamper**: a random byte of a random file of an index (store files, manifest, ``meta.sqlite``,
  a shard's files) changed, on disk and under a running server: refused naming the file, or every
  answer (ids, texts, metadata, top-k) the same as before — never a different answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .corpus import TEXTS

#: The CI size (the issue's targets); the long run scales the counts to its minutes.
CI_COUNTS = {"fuzz": 2000, "kill": 100, "tamper": 100, "reads": 40}
#: --minutes M asks M times these (measured here: ~33 fuzz cases, ~12 kills, ~4 tamper cases a second).
LONG_PER_MINUTE = {"fuzz": 1700, "kill": 40, "tamper": 40, "reads": 40}

SOURCES = ["wiki", "news", "blog"]


class Part:
    """Counts and failures of one part of the suite (a failure: the case, what went wrong, the seed)."""

    def __init__(self, name: str, seed: int):
        self.name, self.seed, self.cases, self.failures = name, seed, 0, []
        self.kinds: Dict[str, int] = {}
        self.accepted = 0  # cases that were valid after all (the others were refused, as they must be)
        self.outcomes: Dict[str, int] = {}  # the kill loop: states found, before or after the operation

    def case(self, kind: str) -> None:
        self.cases += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def outcome(self, name: str) -> None:
        self.outcomes[name] = self.outcomes.get(name, 0) + 1

    def fail(self, kind: str, what: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(f"{kind} (case {self.cases}, seed {self.seed}): {what[:600]}")

    def result(self, seconds: float) -> dict:
        return {"cases": self.cases, "failures": len(self.failures), "accepted": self.accepted,
                "outcomes": dict(sorted(self.outcomes.items())),
                "by_kind": dict(sorted(self.kinds.items())),
                "first_failures": self.failures[:20], "seconds": round(seconds, 1)}


def _passages(rng: random.Random, tag: str, n: int):
    from agrame.corpus import Passage

    return [Passage(f"{tag}{i}", f"{rng.choice(TEXTS)} Item {tag}{i}.",
                    metadata={"source": rng.choice(SOURCES), "year": rng.randint(1990, 2025),
                              "flag": rng.random() < 0.5}) for i in range(n)]


def _hash_folder(folder: Path) -> str:
    """Every file's bytes but SQLite's transient ones and the lock (what 'unchanged' means)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.endswith(("-wal", "-shm")) and not p.name.endswith(".lock"):
            h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def state_of(path: Path, encoder, query: str = "coral reef") -> dict:
    """What a reader sees, opened fresh with every file checksummed: content, generation, exact top-k."""
    from agrame.index.sharded import is_sharded, open_index
    from agrame.index.store import verify_crc

    shards = [path / s for s in json.loads((path / "shards.json").read_text())["shards"]] if is_sharded(path) \
        else [path]
    for folder in shards:
        verify_crc(folder)
    index = open_index(path, model=encoder, verify=True)
    try:
        content = {}
        for shard in getattr(index, "shards", [index]):
            for pid, pos in shard.store.live_ids().items():
                record = shard.store.record(pos)
                content[pid] = (record["text"], json.dumps(shard.store.metadata(pos), sort_keys=True))
        top = [(h.passage_id, round(h.score, 4)) for h in index.search(query, "passage", top_k=5, exact=True)]
        return {"generation": index.manifest.get("generation"), "content": content, "top": top}
    finally:
        close = getattr(index, "close", None)
        if close:
            close()
        elif index.store is not None:
            index.store.close()


# -- fuzz ------------------------------------------------------------------------------------------

def _mutate(rng: random.Random, data: bytes) -> bytes:
    """One random corruption of a file's bytes."""
    kind = rng.randrange(12)
    if kind == 0 and data:
        at = rng.randrange(len(data))
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    if kind == 1:
        return data[:rng.randrange(len(data) + 1)]
    if kind == 2:
        return data.replace(b'"', b"", rng.randint(1, 3))
    if kind == 3:
        return b"\xef\xbb\xbf" + data if rng.random() < 0.5 else data.decode("utf-8", "replace").encode("utf-16")
    if kind == 4:
        return data + b"\x00" * rng.randint(1, 8)
    if kind == 5:
        return b"[" * rng.randint(60, 3000) + b"]" * rng.randint(0, 3000) + b"\n" + data
    if kind == 6:
        return data + b'{"id": "x", "text": "' + b"a" * rng.randint(1000, 400_000) + b'"}\n'
    if kind == 7:
        return data.replace(b"\n", b"\r\n") if rng.random() < 0.5 else data.replace(b"\n", b"\r")
    if kind == 8:
        return data + rng.choice([b'{"id": 3, "text": []}\n', b'{"text": null}\n', b'{"id": "", "text": "t"}\n',
                                  b'{"id": "a\\ud800", "text": "lone surrogate"}\n', b'[1, 2]\n', b'"text"\n',
                                  b'{"id": "m", "text": "t", "metadata": {"k": {"deep": [1]}}}\n',
                                  b'{"id": "m", "text": "t", "metadata": [1]}\n', b"\t\t\t\n", b"q1\n"])
    if kind == 9:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    if kind == 10:
        lines = data.split(b"\n")
        rng.shuffle(lines)
        return b"\n".join(lines + lines[:rng.randint(0, 3)])  # duplicated ids, too
    return data.decode("utf-8", "replace").encode("latin-1", "replace")


def _valid_lines(kind: str, rng: random.Random, n: int) -> bytes:
    rows = []
    for i in range(n):
        text = rng.choice(TEXTS)
        if kind == "jsonl":
            rows.append(json.dumps({"id": f"p{i}", "text": text, "metadata": {"source": rng.choice(SOURCES)}}))
        elif kind == "tsv":
            rows.append(f"p{i}\t{text}")
        elif kind == "txt":
            rows.append(text)
        elif kind == "queries.tsv":
            rows.append(f"q{i}\t{text[:30]}")
        elif kind == "queries.jsonl":
            rows.append(json.dumps({"id": f"q{i}", "text": text[:30]}))
        elif kind == "run":
            rows.append(f"q{i % 3} Q0 p{i} {i + 1} {10 - i * 0.1:.3f} agrame")
        else:  # qrels
            rows.append(f"q{i % 3} 0 p{i} {rng.randint(0, 2)}")
    return ("\n".join(rows) + "\n").encode()


def _refusal_ok(exc: BaseException, path: Path) -> bool:
    """A refusal that names the file (its path or name) and is one of the readers' ValueErrors."""
    return isinstance(exc, ValueError) and (str(path) in str(exc) or path.name in str(exc))


def fuzz_files(part: Part, rng: random.Random, work: Path, cases: int) -> None:
    from agrame.io import read_passages
    from agrame.runs import read_qrels, read_queries, read_run

    readers = {"jsonl": ("passages.jsonl", read_passages), "tsv": ("passages.tsv", read_passages),
               "txt": ("passages.txt", read_passages), "queries.tsv": ("q.tsv", read_queries),
               "queries.jsonl": ("q.jsonl", read_queries), "run": ("a.run", read_run), "qrels": ("a.qrels", read_qrels)}
    for _ in range(cases):
        kind = rng.choice(sorted(readers))
        name, reader = readers[kind]
        path = work / name
        data = _valid_lines(kind, rng, rng.randint(0, 12))
        for _ in range(rng.randint(0, 3)):
            data = _mutate(rng, data)
        path.write_bytes(data)
        part.case(f"file:{kind}")
        try:
            reader(str(path))
            part.accepted += 1
        except Exception as exc:  # noqa: BLE001 - what the suite sorts into refusals and failures
            if not _refusal_ok(exc, path):
                part.fail(f"file:{kind}", f"{type(exc).__name__}: {exc} ({data[:80]!r})")


def _random_value(rng: random.Random):
    return rng.choice([rng.choice(SOURCES), rng.randint(1985, 2030), rng.random() < 0.5, None, 1.5, "", [], {},
                       "a" * rng.randint(0, 5000), "\ud800", float("nan"), 10 ** 30, ["wiki", 2000]])


def _random_filter(rng: random.Random, depth: int = 0, budget: Optional[List[int]] = None):
    """A random filter, valid or not: deep (up to 40), wide (up to 300 terms) and long ``$in`` lists,
    at most ~600 nodes in all."""
    budget = budget if budget is not None else [600]
    budget[0] -= 1
    roll = rng.random()
    if depth > rng.randint(1, 40) or roll < 0.35 or budget[0] <= 0:
        key = rng.choice(["source", "year", "flag", "missing", "", "$bad", "a" * 300, "\x00k"])
        op = rng.choice(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$regex", None])
        if op is None:
            return {key: _random_value(rng)}
        arg = [_random_value(rng) for _ in range(rng.choice([0, 1, 3, 10_001]))] if op in ("$in", "$nin") \
            else _random_value(rng)
        return {key: {op: arg}}
    if roll < 0.55:
        return {"$not": _random_filter(rng, depth + 1, budget)}
    if roll < 0.95:
        width = rng.choice([0, 1, 2, 3, 300 if depth == 0 else 2])
        return {rng.choice(["$and", "$or"]): [_random_filter(rng, depth + 1, budget) for _ in range(width)]}
    return rng.choice([[], "text", 3, None, {"$and": {}}])


def fuzz_filters(part: Part, rng: random.Random, index, cases: int) -> None:
    from agrame.index.metadata import FilterError, matches, parse_filter

    store = index.store
    metas = [store.metadata(p) for p in range(len(store))]
    for _ in range(cases):
        spec = _random_filter(rng)
        as_text = rng.random() < 0.2
        if as_text:
            try:
                spec = json.dumps(spec)
            except (ValueError, TypeError):
                continue
        part.case("filter")
        try:
            tree = parse_filter(spec)
        except FilterError:
            continue
        except Exception as exc:  # noqa: BLE001
            part.fail("filter", f"parse: {type(exc).__name__}: {exc}")
            continue
        part.accepted += 1
        try:
            mask = store.allowed(spec)
            want = [matches(m, tree) for m in metas]
            got = [bool(x) for x in (mask if mask is not None else [True] * len(metas))]
            if got != want:
                part.fail("filter", f"SQL and Python disagree on {str(spec)[:200]}")
        except FilterError:
            pass
        except Exception as exc:  # noqa: BLE001
            part.fail("filter", f"search: {type(exc).__name__}: {exc}")


_ENDPOINTS = [("POST", "/search"), ("POST", "/rank"), ("POST", "/cite"), ("GET", "/passages/{id}"),
              ("POST", "/passages"), ("DELETE", "/passages"), ("GET", "/health"), ("GET", "/"), ("GET", "/nothing")]


def _random_body(rng: random.Random, path: str):
    base = {"/search": {"query": "coral reef", "granularity": "sentence", "top_k": 3},
            "/rank": {"query": "coral", "passages": ["Coral reefs bleach.", "Warsaw is a city."]},
            "/cite": {"answer": "Reefs bleach in warm water.", "passages": [{"id": "a", "text": TEXTS[0]}]},
            "/passages": {"passages": [{"id": "n1", "text": "New text."}]}}.get(path, {})
    body = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(list(body) + ["filter", "top_k", "granularity", "ids", "explain", "nprobe", "ncandidates",
                                       "allow_partial", "margin", "missing", "extra"])
        body[key] = rng.choice([_random_value(rng), _random_filter(rng), -1, 0, 10 ** 9, "span", ["a", 3],
                                [{"id": 3}], [{"text": None}], {"id": "x"}])
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.15:
        raw = _mutate(rng, raw)
    elif roll < 0.2:
        raw = b'{"query": ' + b'[' * rng.randint(50, 5000) + b']' * rng.randint(0, 5000) + b'}'
    return raw


def fuzz_http(part: Part, rng: random.Random, clients: Dict[str, object], cases: int) -> None:
    """``clients``: "read" (read-only server), "write" (writable, the key sent) — only for bodies the
    server must refuse, so that the index stays as it was."""
    for _ in range(cases):
        method, path = rng.choice(_ENDPOINTS)
        url = path.replace("{id}", rng.choice(["p1", "nope", "%00", "a" * 3000, "..%2F..%2Fetc", "%ff%fe", "p1?x=1"]))
        if rng.random() < 0.3:
            url += "?" + rng.choice(["top_k=-1", "q=%ff", "a=" + "b" * 9000, "&&==", "x=%00"])
        writing = method in ("POST", "DELETE") and path == "/passages"
        client = clients["write"] if writing and rng.random() < 0.7 else clients["read"]
        headers = {"content-type": rng.choice(["application/json", "text/plain", "application/x-www-form-urlencoded"])}
        if writing and client is clients["write"]:
            headers["x-api-key"] = rng.choice(["key-of-the-suite", "wrong", ""])
        body = _random_body(rng, path) if method != "GET" else None
        if writing and headers.get("x-api-key") == "key-of-the-suite":
            body = b'{"passages": ' + (body or b"") + b"}"  # never a valid write: the index must not change
        part.case(f"http:{method} {path}")
        try:
            r = client.request(method, url, content=body, headers=headers)
        except Exception as exc:  # noqa: BLE001
            part.fail(f"http:{method} {path}", f"client raised {type(exc).__name__}: {exc}")
            continue
        part.accepted += int(r.status_code < 400)
        if r.status_code >= 500:
            part.fail(f"http:{method} {path}", f"{r.status_code}: {r.text[:300]}")
        elif r.status_code >= 400 and path != "/":
            try:
                ok = "error" in r.json()
            except ValueError:
                ok = False
            if not ok or "Traceback" in r.text:
                part.fail(f"http:{method} {path}", f"{r.status_code} not in the error shape: {r.text[:300]}")


def fuzz_cli(part: Part, rng: random.Random, index: Path, model: Path, work: Path, cases: int) -> None:
    """Each case: a valid command line of a command, then one to three of its values replaced by a bad
    one, a flag dropped or repeated. Writes go to a copy (``other-index``), never the checked index."""
    from agrame_app.cli import main

    (work / "cli-passages.jsonl").write_bytes(_valid_lines("jsonl", rng, 5))
    (work / "cli-queries.tsv").write_bytes(_valid_lines("queries.tsv", rng, 3))
    (work / "cli.run").write_bytes(_valid_lines("run", rng, 6))
    (work / "cli.qrels").write_bytes(_valid_lines("qrels", rng, 6))
    other = work / "other-index"
    m, ix, ps = str(model), str(index), str(work / "cli-passages.jsonl")
    bases = {"search": ["search", "-i", ix, "coral reef", "--top-k", "3", "--granularity", "sentence", "-m", m,
                        "--filter", '{"source": "wiki"}'],
             "search-batch": ["search", "-i", ix, "--queries", str(work / "cli-queries.tsv"), "--run",
                              str(work / "cli-out.run"), "-m", m],
             "rank": ["rank", "-q", "coral", "-p", ps, "-k", "2", "-m", m],
             "explain": ["explain", "-q", "coral", "-i", ix, "--id", "p1", "-m", m],
             "evaluate": ["evaluate", "--run", str(work / "cli.run"), "--qrels", str(work / "cli.qrels")],
             "index": ["index", "-p", ps, "-i", str(other), "-m", m],
             "delete": ["delete", "-i", str(other), "p1", "p2"],
             "delete-filter": ["delete", "-i", str(other), "--filter", '{"year": {"$lt": 2000}}'],
             "compact": ["compact", "-i", str(other)],
             "models": ["models", "-f", "jsonl"]}
    bad = ["0", "-3", "1e999", "nan", "", "span", "{", '{"source": {"$gt": []}}', '{"$or": []}', "x" * 300,
           str(work / "nothing.jsonl"), str(work), "/dev/null", "\ud800", "a" * 5000, ix, "--", "-"]
    before = _hash_folder(index)
    for _ in range(cases):
        name = rng.choice(sorted(bases))
        argv = list(bases[name])
        if name in ("delete", "delete-filter", "compact") or (name == "index" and rng.random() < 0.5):
            shutil.rmtree(other, ignore_errors=True)
            shutil.copytree(index, other)
            if name == "index":
                argv += [rng.choice(["--add", "--upsert", "--overwrite"])]
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            if len(argv) < 2:
                break
            at = rng.randrange(1, len(argv))
            roll = rng.random()
            if roll < 0.6:
                argv[at] = rng.choice(bad)
            elif roll < 0.8:
                del argv[at]
            else:
                argv.insert(at, argv[at])
        argv = [str(other) if a == ix and name in ("index", "delete", "delete-filter", "compact") else a for a in argv]
        part.case(f"cli:{name}")
        out, err = io.StringIO(), io.StringIO()
        try:
            # A bad value may be taken as a path to write ("{", "1e999"): it lands in the work folder.
            with contextlib.chdir(work), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # noqa: BLE001
            part.fail(f"cli:{name}", f"{argv[:10]}: {type(exc).__name__}: {exc}")
            continue
        part.accepted += int(code == 0)
        if code not in (0, 2) or "Traceback" in err.getvalue():
            part.fail(f"cli:{name}", f"{argv[:10]}: exit {code}: {err.getvalue()[-300:]}")
    shutil.rmtree(other, ignore_errors=True)
    if _hash_folder(index) != before:
        part.fail("cli", "the index changed")


# -- kill ------------------------------------------------------------------------------------------

#: how long an uninterrupted child may run before the suite calls it hung (ops take well under a second)
CHILD_TIMEOUT = 300.0


def _timed(model: Path, target: Callable, *args) -> float:
    """Seconds ``target(*args)`` takes in a child (:mod:`.clean_fork`), to its exit (what a kill's moment is drawn
    against)."""
    from . import clean_fork

    started = time.monotonic()
    code = clean_fork.finish(clean_fork.start(model, target, *args), CHILD_TIMEOUT)
    if code is None:
        raise RuntimeError(f"an uninterrupted operation had not ended after {CHILD_TIMEOUT:.0f} s in its child")
    if code != 0:
        raise RuntimeError(f"an uninterrupted operation failed in its child (exit {code})")
    return time.monotonic() - started


def _killed(model: Path, target: Callable, args: tuple, delay: float) -> bool:
    """Run ``target(*args)`` in a child killed with SIGKILL after ``delay`` seconds; whether it had finished."""
    from . import clean_fork

    return clean_fork.finish(clean_fork.start(model, target, *args), delay) == 0


def _write_child(model: Path, path: Path, op: str, arg) -> None:
    from .clean_fork import encoder

    _write(path, encoder(model), op, arg)


def _build_child(model: Path, passages, path: Path) -> None:
    from agrame.index import build_index

    from .clean_fork import encoder

    build_index(encoder(model), passages, path, progress=False)


def _plan(rng: random.Random, op: str, state: dict, trial: int):
    """(what to do with a writer, the content it leads to)."""
    content = dict(state["content"])
    live = sorted(content)
    if op in ("add", "upsert", "sharded-upsert", "overwrite"):
        olds = rng.sample(live, min(len(live), 2)) if op in ("upsert", "sharded-upsert") else []
        new = _passages(rng, f"t{trial}-", 4)
        from agrame.corpus import Passage

        passages = [Passage(pid, f"{rng.choice(TEXTS)} Changed {trial}.", metadata={"source": "new"}) for pid in olds]
        passages += new
        if op == "overwrite":
            content = {}
        for p in passages:
            content[p.id] = (p.text, json.dumps(p.metadata or {}, sort_keys=True))
        return passages, content
    if op in ("delete", "sharded-delete"):
        ids = rng.sample(live, min(len(live) - 2, 3))
        for pid in ids:
            content.pop(pid)
        return ids, content
    return None, content  # compact


def _write(path: Path, encoder, op: str, arg) -> None:
    from agrame.index import IndexWriter, build_index
    from agrame.index.sharded import ShardedWriter

    if op == "overwrite":
        build_index(encoder, arg, path, overwrite=True, progress=False)
        return
    sharded = op.startswith("sharded")
    with (ShardedWriter(path, compact_threshold=None, model=encoder) if sharded else
          IndexWriter(path, compact_threshold=None, say=lambda _: None)) as w:
        if op.endswith("add"):
            w.add(encoder, arg)
        elif op.endswith("upsert"):
            w.upsert(encoder, arg)
        elif op.endswith("delete"):
            w.delete(arg)
        else:
            w.compact()


def _leftovers(path: Path) -> List[str]:
    from .fault import leftovers

    if (path / "shards.json").is_file():
        return [f"{s}/{x}" for s in json.loads((path / "shards.json").read_text())["shards"]
                for x in leftovers(path / s)]
    return leftovers(path)


def _recover(path: Path, encoder) -> None:
    from agrame.index import IndexWriter
    from agrame.index.sharded import ShardedWriter

    with (ShardedWriter(path, model=encoder) if (path / "shards.json").is_file() else
          IndexWriter(path, say=lambda _: None)):
        pass


def kill_loop(part: Part, rng: random.Random, work: Path, encoder, model: Path, cases: int) -> None:
    from agrame.index import build_index
    from agrame.index.sharded import build_sharded

    single, sharded, fresh = work / "kill-ix", work / "kill-sh", work / "kill-fresh"
    build_index(encoder, _passages(rng, "k", 24), single, progress=False)
    build_sharded(encoder, _passages(rng, "s", 24), sharded, 2, progress=False)
    states = {single: state_of(single, encoder), sharded: state_of(sharded, encoder)}
    ops = ["add", "upsert", "delete", "compact", "overwrite", "fresh", "sharded-upsert", "sharded-delete", "full-disk"]
    durations: Dict[str, float] = {}
    for trial in range(cases):
        op = ops[trial % len(ops)]
        part.case(f"kill:{op}")
        try:
            if op == "fresh":
                _kill_fresh(part, rng, fresh, encoder, model, durations)
            elif op == "full-disk":
                _full_disk(part, rng, single, encoder, states)
            else:
                _kill_change(part, rng, sharded if op.startswith("sharded") else single, encoder, model, op, trial,
                             states, durations)
        except Exception as exc:  # noqa: BLE001
            part.fail(f"kill:{op}", f"{type(exc).__name__}: {exc} {traceback.format_exc(limit=-3)[-500:]}")
            return  # the state is unknown from here


def _kill_change(part, rng, path, encoder, model, op, trial, states, durations) -> None:
    before = states[path]
    sharded = op.startswith("sharded")
    arg, content = _plan(rng, op, before, trial)
    if op not in durations:  # one uninterrupted run, in a child as the killed ones are, measures how long it takes
        durations[op] = _timed(model, _write_child, model, path, op, arg)
        states[path] = state_of(path, encoder)
        if states[path]["content"] != content:
            part.fail(f"kill:{op}", "an uninterrupted run did not give the planned content")
        return
    finished = _killed(model, _write_child, (model, path, op, arg), rng.uniform(0, 1.25 * durations[op]))
    part.accepted += int(finished)  # (for the kill loop: the operation had finished when the kill came)
    if sharded:  # a change across shards is all-or-redone: the next writer finishes it from the journal
        _recover(path, encoder)
    found = state_of(path, encoder)
    part.outcome("before" if found == before else "after")
    if found != before and found["content"] != content:
        part.fail(f"kill:{op}", "a state neither before nor after the operation")
    elif found != before and found["generation"] <= before["generation"]:
        part.fail(f"kill:{op}", "the content changed without a new generation")
    _recover(path, encoder)
    left = _leftovers(path)
    if left:
        part.fail(f"kill:{op}", f"after recovery the folder still holds {left[:5]}")
    if state_of(path, encoder) != found:
        part.fail(f"kill:{op}", "recovery changed what readers see")
    states[path] = found


def _kill_fresh(part, rng, path, encoder, model, durations) -> None:
    from agrame.index import build_index
    from agrame.index.writer import stale_beside

    passages = _passages(rng, "f", 10)
    shutil.rmtree(path, ignore_errors=True)
    if "fresh" not in durations:
        durations["fresh"] = _timed(model, _build_child, model, passages, path)
        shutil.rmtree(path)
    part.accepted += int(_killed(model, _build_child, (model, passages, path), rng.uniform(0, 1.25 * durations["fresh"])))
    part.outcome("after" if path.exists() else "before")
    if path.exists():
        found = state_of(path, encoder)
        if sorted(found["content"]) != sorted(p.id for p in passages):
            part.fail("kill:fresh", "a fresh build left a partial index at the path")
        shutil.rmtree(path)
    build_index(encoder, passages, path, progress=False)  # the next build there cleans what the killed one left
    left = [str(p.name) for p in stale_beside(path, every=True)] + \
        [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.tmp-")]
    if left:
        part.fail("kill:fresh", f"a killed build's temporary folder outlived the next build: {sorted(set(left))}")


def _full_disk(part, rng, path, encoder, states) -> None:
    """A change with the file size limit (``ulimit -f``) somewhere between nothing and enough."""
    import resource

    before = states[path]
    op = rng.choice(["add", "upsert"])
    arg, content = _plan(rng, op, before, rng.randrange(10 ** 6))
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    limit = rng.randint(1, 2 * size)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    error = None
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        _write(path, encoder, op, arg)
    except Exception as exc:  # noqa: BLE001
        error = exc
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    from agrame.index.format import NoSpaceError

    if error is not None and not isinstance(error, NoSpaceError):
        part.fail("kill:full-disk", f"limit {limit}: {type(error).__name__}: {error}")
    found = state_of(path, encoder)
    part.outcome("before" if error is not None else "after")
    want = before if error is not None else None
    if want is not None and found != want:
        part.fail("kill:full-disk", f"limit {limit}: refused, yet the index changed")
    if error is None and found["content"] != content:
        part.fail("kill:full-disk", f"limit {limit}: accepted, yet not the planned content")
    left = _leftovers(path)
    if left:
        part.fail("kill:full-disk", f"limit {limit}: left {left[:5]}")
    states[path] = found


# -- tamper ----------------------------------------------------------------------------------------

def _answers(index, ids: List[str]) -> list:
    out = [index.get(pid) for pid in ids]
    out.append([(h.passage_id, round(h.score, 4)) for h in index.search("coral reef", "passage", top_k=5)])
    out.append([(h.passage_id, h.start, h.end) for h in index.search("capital", "sentence", top_k=5,
                                                                        filter={"source": "wiki"})])
    return out


def _flip(rng: random.Random, folder: Path) -> str:
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.stat().st_size and not p.name.endswith(".lock")]
    file = rng.choice(files)
    data = bytearray(file.read_bytes())
    if file.name == "meta.sqlite" and rng.random() < 0.7:  # inside a stored value, where a change would show
        needles = [n.encode() for n in SOURCES + ["k1", "k2", "Item", "year"]]
        spots = [i for n in needles for i in range(len(data)) if data.startswith(n, i)]
        at = rng.choice(spots) if spots else rng.randrange(len(data))
    else:
        at = rng.randrange(len(data))
    data[at] ^= 1 << rng.randrange(8)
    file.write_bytes(bytes(data))
    return str(file.relative_to(folder))


def tamper_loop(part: Part, rng: random.Random, work: Path, encoder, model: Path, cases: int) -> None:
    from fastapi.testclient import TestClient

    from agrame.index import build_index
    from agrame.index.sharded import open_index
    from agrame.index.sharded import build_sharded
    from agrame_app.serve import create_app

    pristine = {"single": work / "tamper-ix", "sharded": work / "tamper-sh"}
    build_index(encoder, _passages(rng, "k", 16), pristine["single"], progress=False)
    build_sharded(encoder, _passages(rng, "s", 16), pristine["sharded"], 2, progress=False)
    ids = {name: sorted(state_of(path, encoder)["content"]) for name, path in pristine.items()}
    truth = {}
    for name, path in pristine.items():
        index = open_index(path, model=encoder)
        truth[name] = _answers(index, ids[name])
    for trial in range(cases):
        name = rng.choice(sorted(pristine))
        where = rng.choice(["disk", "server"])
        folder = work / f"tampered-{trial % 2}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(pristine[name], folder)
        part.case(f"tamper:{name}:{where}")
        if where == "disk":
            file = _flip(rng, folder)
            try:
                index = open_index(folder, model=encoder, verify=True)
                got = _answers(index, ids[name])
            except ValueError as exc:  # refused: it must name the file
                if Path(file).name not in str(exc) and "shards.json" not in str(exc):
                    part.fail(f"tamper:{name}:disk", f"{file}: refused without naming it: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001
                part.fail(f"tamper:{name}:disk", f"{file}: {type(exc).__name__}: {exc}")
                continue
            if got != truth[name]:
                part.fail(f"tamper:{name}:disk", f"{file}: a different answer")
        else:
            client = TestClient(create_app(folder, model=str(model)), raise_server_exceptions=False)
            file = _flip(rng, folder)
            _tampered_server(part, name, file, client, ids[name], truth[name])


def _tampered_server(part, name: str, file: str, client, ids: List[str], truth: list) -> None:
    kind = f"tamper:{name}:server"
    answers = [client.get(f"/passages/{pid}") for pid in ids]
    answers.append(client.post("/search", json={"query": "coral reef", "granularity": "passage", "top_k": 5}))
    answers.append(client.post("/search", json={"query": "capital", "granularity": "sentence", "top_k": 5,
                                                "filter": {"source": "wiki"}}))
    health = client.get("/health")
    refused = [a for a in answers if a.status_code != 200]
    for a in refused:
        if a.status_code != 503 or Path(file).name not in a.text:
            part.fail(kind, f"{file}: {a.status_code} {a.text[:200]}")
            return
    if refused and (health.status_code != 503 or Path(file).name not in health.text):
        part.fail(kind, f"{file}: reads refused but /health says {health.status_code} {health.text[:200]}")
    for k, a in enumerate(answers[:len(ids)]):
        if a.status_code == 200:
            body = a.json()
            if {k2: body.get(k2) for k2 in ("id", "text", "metadata")} != \
                    {k2: (truth[k] or {}).get(k2) for k2 in ("id", "text", "metadata")}:
                part.fail(kind, f"{file}: a different passage served for {ids[k]}")
    for a, want in ((answers[-2], truth[-2]), (answers[-1], truth[-1])):
        if a.status_code == 200:
            got = [(h["passage_id"], round(h["score"], 4)) for h in a.json()["results"]] if want is truth[-2] else \
                [(h["passage_id"], h["start"], h["end"]) for h in a.json()["results"]]
            if got != want:
                part.fail(kind, f"{file}: a different ranking served")


# -- reads (issue 62): what is read is checked, whatever edits the files; no read needs free space ------

def _served_answers(client, ids: List[str]) -> list:
    """A server's answers to every read the tamper loop compares: ``(status, body)`` each."""
    answers = [client.get(f"/passages/{pid}") for pid in ids]
    answers.append(client.post("/search", json={"query": "coral reef", "granularity": "passage", "top_k": 5}))
    return [(a.status_code, {k: v for k, v in a.json().items() if k != "ms"}) for a in answers]  # (ms: timing)


def _edited_answers(got: list, truth: list, file: str) -> List[str]:
    """What in ``got`` is neither the truth nor a 503 naming ``file``."""
    wrong = []
    for (status, body), (_, want) in zip(got, truth):
        if status == 503 and body.get("damaged", "").endswith(Path(file).name):
            continue
        if status != 200 or body != want:
            wrong.append(f"{status} {json.dumps(body)[:160]}")
    return wrong


def reads_loop(part: Part, rng: random.Random, work: Path, encoder, model: Path, cases: int) -> None:
    """Edits through a shared map and a toggling writer under a server (never an edited value with a 200; put
    back, served again without a restart); a full disk (``RLIMIT_FSIZE``) during reads, server writes and
    lock takes (reads work, writes 507, the lock released: the next write succeeds)."""
    from fastapi.testclient import TestClient

    from agrame.index import build_index
    from agrame_app.serve import create_app

    pristine = work / "reads-ix"
    build_index(encoder, _passages(rng, "r", 12), pristine, progress=False)
    ids = sorted(state_of(pristine, encoder)["content"])
    store = [p.name for p in sorted(pristine.rglob("*")) if p.is_file() and p.stat().st_size
             and p.name in ("passages.jsonl", "codes.bin", "residuals.bin", "meta.sqlite", "sentences.bin")]
    truth = None
    for trial in range(cases):
        kind = rng.choice(["mapped-edit", "mapped-edit", "toggle", "full-disk"])
        part.case(f"reads:{kind}")
        folder = work / f"reads-{trial % 2}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(pristine, folder)
        if kind == "full-disk":
            _full_disk_reads(part, folder, model, ids)
            continue
        client = TestClient(create_app(folder, model=str(model)), raise_server_exceptions=False)
        if truth is None:
            truth = _served_answers(client, ids)
        file = folder / rng.choice(store)
        at, mask = rng.randrange(file.stat().st_size), 1 << rng.randrange(8)
        if kind == "mapped-edit":
            import mmap

            with open(file, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                m[at] = m[at]  # the page's first write through a map touches mtime (seen here), later ones do not
                _served_answers(client, ids[:1])
                m[at] ^= mask
                wrong = _edited_answers(_served_answers(client, ids), truth, file.name)
                m[at] ^= mask  # put back the same way
        else:
            wrong = _toggled(client, file, at, mask, ids, truth)
        if wrong:
            part.fail(f"reads:{kind}", f"{file.name}@{at}: {len(wrong)} edited answers, first: {wrong[0]}")
            continue
        back = _served_answers(client, ids)
        if back != truth or client.get("/health").status_code != 200:
            part.fail(f"reads:{kind}", f"{file.name}@{at}: put back, but not served again: "
                                       f"{[s for s, _ in back]}")


def _toggled(client, file: Path, at: int, mask: int, ids: List[str], truth: list, seconds: float = 0.4) -> List[str]:
    """Reads while a writer flips the byte at ``at`` and back every ~0.3 ms (``os.pwrite``): the edited answers."""
    from .edits import toggling

    wrong: List[str] = []
    deadline = time.monotonic() + seconds
    with toggling(file, at, mask):
        while time.monotonic() < deadline:
            wrong += _edited_answers(_served_answers(client, ids), truth, file.name)
    return wrong


def _full_disk_child(model: Path, folder: Path, ids: List[str]) -> None:
    """:func:`_full_disk_reads`' child (its exit code says what failed)."""
    import resource

    from fastapi.testclient import TestClient

    from agrame.index import Index
    from agrame_app.serve import create_app

    from .clean_fork import encoder

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    index = Index(folder, model=encoder(model))
    if not index.search("coral reef", "passage", top_k=3) or index.get(ids[0]) is None:
        os._exit(13)
    client = TestClient(create_app(folder, model=str(model), allow_writes=True, api_key="k"),
                        raise_server_exceptions=False)
    head = {"X-API-Key": "k"}
    if client.post("/search", json={"query": "coral reef"}).status_code != 200:
        os._exit(14)
    deleted = client.request("DELETE", "/passages", json={"ids": [ids[0]]}, headers=head)
    upserted = client.post("/passages", json={"passages": [{"id": "new", "text": "A new reef passage."}]},
                           headers=head)
    for answer in (deleted, upserted):
        if answer.status_code != 507 or "no space left" not in answer.json().get("error", ""):
            os._exit(15)
    os._exit(0)


def _full_disk_reads(part: Part, folder: Path, model: Path, ids: List[str]) -> None:
    """In a child (:mod:`.clean_fork`) whose files may not grow (``RLIMIT_FSIZE`` at 0 bytes, SIGXFSZ ignored): a fresh open,
    search and read work; a server's delete and upsert are 507 naming a file; afterwards (no limit) the lock is
    free and a write succeeds."""
    from . import clean_fork

    for name in ("meta.sqlite-shm", "meta.sqlite-wal"):
        for leftover in folder.rglob(name):
            leftover.unlink()
    code = clean_fork.finish(clean_fork.start(model, _full_disk_child, model, folder, ids), CHILD_TIMEOUT)
    if code != 0:
        part.fail("reads:full-disk", {None: f"the child had not ended after {CHILD_TIMEOUT:.0f} s",
                                      1: "an exception", 13: "a read failed", 14: "an HTTP search failed",
                                      15: "a write was not a 507 naming its file"}.get(code, f"exit {code}"))
        return
    try:
        from agrame.index import IndexWriter

        with IndexWriter(folder, lock_timeout=0) as w:  # the lock was released; the write succeeds
            w.delete([ids[0]])
    except Exception as exc:  # noqa: BLE001
        part.fail("reads:full-disk", f"the next write after the full disk: {type(exc).__name__}: {exc}")


# -- the suite -------------------------------------------------------------------------------------

def run_suite(work: Path, seed: int, counts: Dict[str, int], only: Optional[List[str]] = None,
              log: Callable[[str], None] = print) -> dict:
    import torch

    from fastapi.testclient import TestClient

    from agrame.index import Index, build_index
    from agrame_app.serve import create_app

    from benchmarks.common import tiny_encoder

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the kill loop forks
    work.mkdir(parents=True, exist_ok=True)
    encoder = tiny_encoder()
    model = work / "tiny-model"
    if not model.exists():
        encoder.save(model)
    parts = only or ["fuzz", "kill", "tamper", "reads"]
    out: Dict[str, dict] = {"seed": seed, "counts_asked": counts}
    log(f"standing safety suite, seed {seed} (repeat: python -m reliability.probes suite --seed {seed})")
    if "fuzz" in parts:
        started, part, rng = time.monotonic(), Part("fuzz", seed), random.Random(seed)
        index_path = work / "fuzz-ix"
        shutil.rmtree(index_path, ignore_errors=True)
        build_index(encoder, _passages(rng, "p", 40), index_path, progress=False)
        before = _hash_folder(index_path)
        n = counts["fuzz"]
        fuzz_files(part, rng, work, n * 4 // 10)
        index = Index(index_path, model=encoder)
        fuzz_filters(part, rng, index, n * 3 // 10)
        clients = {"read": TestClient(create_app(index_path, model=str(model)), raise_server_exceptions=False),
                   "write": TestClient(create_app(index_path, model=str(model), allow_writes=True,
                                                  api_key="key-of-the-suite"), raise_server_exceptions=False)}
        fuzz_http(part, rng, clients, n * 2 // 10)
        fuzz_cli(part, rng, index_path, model, work, n - part.cases)
        if _hash_folder(index_path) != before:
            part.fail("fuzz", "the index changed")
        out["fuzz"] = part.result(time.monotonic() - started)
        log(f"fuzz: {part.cases} cases, {len(part.failures)} failures ({out['fuzz']['seconds']} s)")
    if "kill" in parts:
        started, part, rng = time.monotonic(), Part("kill", seed), random.Random(seed + 1)
        for name in ("kill-ix", "kill-sh", "kill-fresh"):
            shutil.rmtree(work / name, ignore_errors=True)
        kill_loop(part, rng, work, encoder, model, counts["kill"])
        out["kill"] = part.result(time.monotonic() - started)
        log(f"kill: {part.cases} cases, {len(part.failures)} failures ({out['kill']['seconds']} s)")
    if "tamper" in parts:
        started, part, rng = time.monotonic(), Part("tamper", seed), random.Random(seed + 2)
        for name in ("tamper-ix", "tamper-sh"):
            shutil.rmtree(work / name, ignore_errors=True)
        tamper_loop(part, rng, work, encoder, model, counts["tamper"])
        out["tamper"] = part.result(time.monotonic() - started)
        log(f"tamper: {part.cases} cases, {len(part.failures)} failures ({out['tamper']['seconds']} s)")
    if "reads" in parts:
        started, part, rng = time.monotonic(), Part("reads", seed), random.Random(seed + 3)
        shutil.rmtree(work / "reads-ix", ignore_errors=True)
        reads_loop(part, rng, work, encoder, model, counts["reads"])
        out["reads"] = part.result(time.monotonic() - started)
        log(f"reads: {part.cases} cases, {len(part.failures)} failures ({out['reads']['seconds']} s)")
    out["failures"] = sum(out[p]["failures"] for p in parts)
    for p in parts:
        for failure in out[p]["first_failures"]:
            log(f"FAILED {failure}")
    return out


__all__ = ["CI_COUNTS", "LONG_PER_MINUTE", "run_suite", "state_of"]
