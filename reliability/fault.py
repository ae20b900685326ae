"""Fault harness: writers killed with SIGKILL at random moments, then the index checked.

    python -m reliability.fault --kills 200                      # pooled-corpus sample, default model
    python -m reliability.fault --kills 10 --model DIR --corpus examples/coral.jsonl   # (the tests' size)

Each trial starts a worker process (model loaded, index not yet touched), tells it to run one
operation — ``build`` (``--overwrite`` of the index with another passage set), ``add``,
``upsert``, ``delete`` or ``compact`` — and kills it after a random delay drawn uniformly from
[0, 1.25 × that operation's measured duration] (from the go to the worker's "done", interpreter
exit not counted). Then, reading as a new process would:

1. the index opens and every file passes its checksum (``verify_crc``: CRC-32 of every store
   file, SQLite's integrity check of the metadata);
2. its content — every live passage's id, text and metadata, and the committed generation —
   equals the state *before* the operation or the state *after* it (one generation later), never
   anything else (so a compaction, which changes no content, is told apart by its generation);
3. the next writer recovers: after it takes the lock, no file the manifest does not name is left
   in the folder (nor a temporary folder beside it), every store file has exactly its committed
   size, and the content is unchanged by the recovery.

Counts go to ``benchmarks/results/fault.json`` (kills per operation, states found before / after /
other — other must be 0 — and what recovery removed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

OPS = ("build", "add", "upsert", "delete", "compact")
State = Dict[str, Tuple[str, str]]  # id → (text, metadata as sorted JSON)
GENERATION = "\0generation"  # the state's key for the committed generation (not a passage id)


def _metadata(rng: random.Random) -> dict:
    return {"source": rng.choice(["wiki", "news", "blog"]), "year": rng.randint(1990, 2025),
            "tags": rng.sample(["a", "b", "c", "d"], rng.randint(0, 2)), "flag": rng.random() < 0.5}


def _record(pid: str, text: str, meta: Optional[dict]) -> dict:
    return {"id": pid, "text": text, "metadata": meta or {}}


def read_state(path: Path, model=None) -> State:
    """The content a reader sees (opened fresh, every file checksummed)."""
    from agrame.index import Index, verify_crc

    verify_crc(path)
    index = Index(path, model=model, verify=True)
    try:
        state = {GENERATION: index.manifest["generation"]}
        for pid, pos in index.store.live_ids().items():
            record = index.store.record(pos)
            state[pid] = (record["text"], json.dumps(index.store.metadata(pos), sort_keys=True))
        return state
    finally:
        index.store.close()


def leftovers(path: Path) -> List[str]:
    """What a recovered folder holds that its manifest does not name (must be nothing)."""
    from agrame.index.format import read_manifest, store_root

    manifest = read_manifest(path)
    prefix = manifest.get("store", "")
    named = {prefix + n for n in manifest["files"]} | {"manifest.json", ".lock"}
    if manifest.get("metadata"):
        named |= {prefix + manifest["metadata"] + s for s in ("", "-wal", "-shm")}
    if prefix:
        named.add(prefix.rstrip("/"))
    found = []
    for f in path.rglob("*"):
        rel = f.relative_to(path).as_posix()
        if rel not in named:
            found.append(rel)
    root = store_root(path, manifest)
    for name, info in manifest["files"].items():
        if (root / name).stat().st_size != info["size"]:
            found.append(f"{name}: {(root / name).stat().st_size} bytes, committed {info['size']}")
    found += [p.name for p in path.parent.glob(f".{path.name}.tmp-*")]
    return found


def plan(op: str, state: State, pool: List[str], rng: random.Random, trial: int, size: int) -> Tuple[dict, State]:
    """An operation's arguments and the state it leads to."""
    after = dict(state)
    after[GENERATION] = state[GENERATION] + 1  # every operation here commits exactly one generation
    live = sorted(k for k in state if k != GENERATION)
    if op in ("add", "upsert", "build"):
        records = []
        if op == "build":
            keep = rng.sample(live, max(1, len(live) - size)) if len(live) > size else live
            records = [_record(pid, *state[pid][:1], json.loads(state[pid][1])) for pid in keep]
            after = {GENERATION: after[GENERATION], **{pid: state[pid] for pid in keep}}
        olds = rng.sample(live, min(len(live), size // 2)) if op == "upsert" else []
        news = [f"t{trial}-{j}" for j in range(size - len(olds))]
        for pid in olds + news:
            meta = _metadata(rng)
            text = rng.choice(pool)
            records.append(_record(pid, text, meta))
            after[pid] = (text, json.dumps(meta, sort_keys=True))
        return {"op": op, "passages": records}, after
    if op == "delete":
        ids = rng.sample(live, min(len(live) - 1, size))
        for pid in ids:
            after.pop(pid)
        return {"op": op, "ids": ids}, after
    return {"op": "compact"}, after


def worker(args) -> None:
    """One operation on the index: the model loads first, then the parent writes the path of the
    operation's spec to stdin (so a worker can start while the previous trial is being checked)."""
    from agrame.corpus import Passage
    from agrame.loading import load_encoder
    from agrame.index import IndexWriter, build_index

    encoder = load_encoder(args.model)
    print("ready", flush=True)
    spec = json.loads(Path(sys.stdin.readline().strip()).read_text())
    passages = [Passage(r["id"], r["text"], metadata=r["metadata"] or None) for r in spec.get("passages", [])]
    op = spec["op"]
    if op == "build":
        build_index(encoder, passages, args.index, overwrite=True, progress=False)
    else:
        with IndexWriter(args.index, compact_threshold=None) as w:
            if op == "add":
                w.add(encoder, passages)
            elif op == "upsert":
                w.upsert(encoder, passages)
            elif op == "delete":
                w.delete(spec["ids"])
            else:
                w.compact()
    print("done", flush=True)


def _op_seconds(proc: subprocess.Popen) -> float:
    """Seconds from the parent's go to the worker's 'done' (the operation, without interpreter exit)."""
    started = time.perf_counter()
    line = proc.stdout.readline()
    if line.strip() != "done":
        raise RuntimeError(f"fault worker failed (said {line!r})")
    return time.perf_counter() - started


def _start(index: Path, model: Optional[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "reliability.fault", "worker", "--index", str(index)]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    return proc


def _go(proc: subprocess.Popen, spec_file: Path) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"fault worker did not start (said {line!r})")
    proc.stdin.write(f"{spec_file}\n")
    proc.stdin.flush()


def run(index: Path, model: Optional[str], pool: List[str], kills: int, seed: int = 0, size: int = 8,
        log=print, durations: Optional[Dict[str, float]] = None) -> dict:
    """Calibrate each operation's duration (unless ``durations`` are given), then ``kills`` killed
    operations, each checked."""
    from agrame.index import IndexWriter

    rng = random.Random(seed)
    model_arg = model
    spec_file = index.parent / f".{index.name}-fault-spec.json"
    state = read_state(index, model_arg)
    calibrate = durations is None
    durations = dict(durations or {})
    counts = {op: {"kills": 0, "before": 0, "after": 0, "other": 0, "finished_before_kill": 0} for op in OPS}
    recovered: Dict[str, int] = {"trials_with_recovery": 0, "items_removed": 0}
    failures: List[str] = []
    for op in OPS if calibrate else ():  # one uninterrupted run of each
        spec, after = plan(op, state, pool, rng, -1 - OPS.index(op), size)
        spec_file.write_text(json.dumps(spec))
        proc = _start(index, model)
        proc.stdout.readline()
        proc.stdin.write(f"{spec_file}\n")
        proc.stdin.flush()
        durations[op] = _op_seconds(proc)
        proc.wait()
        state = read_state(index, model_arg)
        if state != after:
            failures.append(f"calibration {op}: state differs from the planned one")
    proc = _start(index, model) if kills else None
    for trial in range(kills):
        op = OPS[trial % len(OPS)]
        spec, after = plan(op, state, pool, rng, trial, size)
        before = state
        spec_file.write_text(json.dumps(spec))
        delay = rng.uniform(0, 1.25 * durations[op])
        _go(proc, spec_file)
        time.sleep(delay)
        finished = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The next worker loads its model while this trial is checked (it touches nothing until told).
        proc = _start(index, model) if trial + 1 < kills else None
        c = counts[op]
        c["kills"] += 1
        c["finished_before_kill"] += int(finished)
        try:
            found = read_state(index, model_arg)
        except Exception as exc:  # noqa: BLE001 - any failure to open is what the harness counts
            failures.append(f"trial {trial} ({op}, killed after {delay:.3f} s): does not open: {exc}")
            c["other"] += 1
            break
        verdict = "before" if found == before else "after" if found == after else "other"
        c[verdict] += 1
        if verdict == "other":
            failures.append(f"trial {trial} ({op}, killed after {delay:.3f} s): a mixed state")
            break
        with IndexWriter(index, say=lambda _: None) as w:
            if w.recovered:
                recovered["trials_with_recovery"] += 1
                recovered["items_removed"] += len(w.recovered)
        left = leftovers(index)
        if left:
            failures.append(f"trial {trial} ({op}): after recovery the folder still holds {left[:5]}")
            break
        if read_state(index, model_arg) != found:
            failures.append(f"trial {trial} ({op}): recovery changed the content")
            break
        state = found
        log(f"trial {trial + 1}/{kills}: {op} killed after {delay:.3f} s → {verdict}"
            + (" (it had finished)" if finished else ""))
    if proc is not None:
        proc.kill()
        proc.wait()
    spec_file.unlink(missing_ok=True)
    totals = {k: sum(c[k] for c in counts.values()) for k in ("kills", "before", "after", "other",
                                                              "finished_before_kill")}
    return {"per_operation": counts, "totals": totals, "recovery": recovered,
            "calibration_seconds": {k: round(v, 3) for k, v in durations.items()},
            "failures": failures, "passages_live_at_end": len(state)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--index", required=True)
    w.add_argument("--model", default=None)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--passages", type=int, default=300, help="passages of the pooled corpus in the start index")
    parser.add_argument("--size", type=int, default=8, help="passages per add/upsert/delete")
    parser.add_argument("--model", default=None)
    parser.add_argument("--corpus", default=None, help="a passage file instead of the pooled corpus sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="folder for the index (default: a temporary one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        worker(args)
        return
    import tempfile

    from agrame.corpus import Passage
    from agrame.loading import load_encoder
    from agrame.index import build_index

    from benchmarks.common import command_line, write_result

    rng = random.Random(args.seed)
    if args.corpus:
        from agrame.io import read_passages

        texts = [p.text for p in read_passages(args.corpus)]
        data = args.corpus
    else:
        from benchmarks.data import load_pool

        pool = load_pool()
        texts = [pool.texts[i] for i in sorted(rng.sample(range(len(pool.texts)), args.passages + 2000))]
        data = f"pooled corpus: {args.passages} passages sampled (seed {args.seed}) + 2,000 more as new texts"
    start, pool_texts = texts[:args.passages], texts[args.passages:] or texts
    work = Path(args.work or tempfile.mkdtemp(prefix="agrame-fault-"))
    index = work / "index"
    encoder = load_encoder(args.model)
    build_index(encoder, [Passage(f"p{i}", t, metadata=_metadata(rng)) for i, t in enumerate(start)], index,
                overwrite=index.exists(), progress=False)
    started = time.perf_counter()
    result = run(index, args.model, pool_texts, args.kills, args.seed, args.size)
    result.update(benchmark="fault", harness=2, model=encoder.source, data=data, start_passages=len(start),
                  passages_per_change=args.size, seconds=round(time.perf_counter() - started, 1))
    out = write_result("fault", result, args.out, command_line("reliability.fault", sys.argv[1:]))
    print(json.dumps(result["totals"]), "→", out)
    if result["failures"]:
        print("\n".join(result["failures"]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
