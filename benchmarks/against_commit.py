"""A benchmark command run by an earlier commit's code and by this tree's, alternately, on one machine.

    python -m benchmarks.against_commit --commit 67faa5c^ --metric ms_search_only.median \\
        -- index_search latency --limit 300 --threads 2

A target such as "sentence top 10 ≤ today's" (issue 64) compares code, not machines: a row measured on
the machine of the day the target was set says nothing about another one's. This runs the same command
(a ``benchmarks`` module and its arguments) in a git worktree of ``--commit`` and in this tree, in
``--rounds`` rounds of A B B A (drift cancels), each in its own process with the same threads, and reports
each run's ``--metric`` (a dotted path into the command's result file), the medians of the two, and their
ratio (this tree over the commit's).

The earlier code gets a cache of its own (under ``$AGRAME_CACHE/against-<sha>``) in which the cached
*encodings* (token vectors, sentence spans) are links to this cache's, so both sides search the same
vectors; what the code builds from them (``index-*`` folders) it builds itself, in its own format.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

from .common import REPO, command_line, write_result
from .encodings import cache_root

#: Cache entries both sides read as they are: what ``benchmarks.encodings`` writes from the model and the data.
SHARED_CACHE_PREFIXES = ("colbert-pool-", "sentences-", "sv-")


def resolve(commit: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"error: --commit {commit!r} is not a commit of {REPO}: {out.stderr.strip()}")
    return out.stdout.strip()


def worktree(sha: str, root: Path) -> Path:
    """A detached worktree of ``sha`` (made once, reused)."""
    path = root / f"worktree-{sha[:12]}"
    if not (path / ".git").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(path), sha],
                       check=True, capture_output=True)
    return path


def earlier_cache(sha: str) -> Path:
    """The earlier code's cache: links to this cache's encodings, nothing it builds."""
    ours = cache_root()
    theirs = ours / f"against-{sha[:12]}"
    theirs.mkdir(parents=True, exist_ok=True)
    for entry in ours.iterdir():
        link = theirs / entry.name
        if entry.name.startswith(SHARED_CACHE_PREFIXES) and not link.exists():
            link.symlink_to(entry)
    return theirs


def metric(result: dict, dotted: str) -> float:
    value = result
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            keys = sorted(value)[:12] if isinstance(value, dict) else "none: a value, not a mapping"
            raise SystemExit(f"error: --metric {dotted!r}: the result has no {key!r} (keys: {keys})")
        value = value[key]
    return float(value)


def run_once(tree: Path, cache: Path, command: Sequence[str], label: str) -> dict:
    """One run of ``python -m benchmarks.<command>`` in ``tree``; its result file is the one it wrote."""
    env = {**os.environ, "PYTHONPATH": str(tree), "AGRAME_CACHE": str(cache)}
    results = tree / "benchmarks" / "results"
    kept = {p: p.read_bytes() for p in results.glob("*.json")}
    before = {p: p.stat().st_mtime_ns for p in kept}
    module, *rest = command
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *rest], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {label} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    written = [p for p in results.glob("*.json") if before.get(p) != p.stat().st_mtime_ns]
    if len(written) != 1:
        raise SystemExit(f"error: {label} run wrote {len(written)} result files, not one: {written}")
    result = json.loads(written[0].read_text())
    # Both trees' results are left as they were: the comparison is the record, not either run's file.
    if written[0] in kept:
        written[0].write_bytes(kept[written[0]])
    else:
        written[0].unlink()
    return result


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", required=True, help="the earlier code (any git revision)")
    parser.add_argument("--metric", required=True, help="dotted path into the result file, e.g. ms_search_only.median")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A B B A (default 2)")
    parser.add_argument("--name", default=None, help="result file name (default: against_commit-<module>-<sub>)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then a benchmarks module and its arguments, e.g. index_search latency --limit 300")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, e.g. -- index_search latency --limit 300")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    sha, this, dirty = resolve(args.commit), resolve("HEAD"), _dirty()  # this tree as its runs find it
    tree = worktree(sha, cache_root())
    caches = {"commit": earlier_cache(sha), "this": cache_root()}
    trees = {"commit": tree, "this": REPO}
    runs = []
    for r in range(args.rounds):
        for side in ("commit", "this", "this", "commit"):
            print(f"round {r + 1}/{args.rounds}: {side}", flush=True)
            result = run_once(trees[side], caches[side], command, f"{side}-{len(runs)}")
            runs.append({"side": side, "value": metric(result, args.metric), "date": result.get("date"),
                         "load": result.get("machine", {}).get("load"), "search": result.get("search")})
    medians = {side: statistics.median(r["value"] for r in runs if r["side"] == side) for side in trees}
    name = args.name or "against_commit-" + "-".join(c for c in command[:2] if not c.startswith("-"))
    result = {"benchmark": "against_commit", "what": f"{' '.join(command)} by two versions of the code, alternately",
              "commits": {"commit": sha, "this": this, "this_tree_dirty": dirty},
              "metric": args.metric, "order": "A B B A per round (A: the commit's code, B: this tree's)",
              "runs": runs, "median": medians, "ratio_this_over_commit": round(medians["this"] / medians["commit"], 3)}
    path = write_result(name, result, None, command_line("benchmarks.against_commit", argv))
    print(json.dumps({"median": medians, "ratio": result["ratio_this_over_commit"]}), "→", path)


def _dirty() -> bool:
    out = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True)
    return bool(out.stdout.strip())


if __name__ == "__main__":
    main()
