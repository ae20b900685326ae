"""Issue 52: the standing safety suite (reliability.standing) at CI's size, on every change — seeded
from the clock unless AGRAME_SUITE_SEED is set; a failure prints the seed that repeats it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def test_the_standing_suite_finds_nothing(tmp_path):
    seed = int(os.environ.get("AGRAME_SUITE_SEED", int(time.time()) % 1_000_000))
    out = tmp_path / "suite.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "reliability.probes", "suite", "--seed", str(seed), "--work",
                          str(tmp_path / "work"), "--out", str(out)], capture_output=True, text=True, env=env,
                         timeout=600)
    seconds = time.monotonic() - started
    print(run.stdout[-3000:])
    assert run.returncode == 0, f"seed {seed} (AGRAME_SUITE_SEED={seed} repeats it):\n{run.stdout[-4000:]}\n" \
                                f"{run.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert result["seed"] == seed and result["failures"] == 0
    assert result["fuzz"]["cases"] >= 2000 and result["kill"]["cases"] >= 50 and result["tamper"]["cases"] >= 50
    # every part of each loop ran
    assert {k.split(":")[0] for k in result["fuzz"]["by_kind"]} == {"file", "filter", "http", "cli"}
    assert len(result["kill"]["by_kind"]) == 9 and len(result["tamper"]["by_kind"]) == 4
    # issue 62: edits through a shared map, a toggling writer racing reads, full disks during reads and writes
    assert result["reads"]["cases"] >= 40 and set(result["reads"]["by_kind"]) == {
        "reads:mapped-edit", "reads:toggle", "reads:full-disk"}
    assert result["kill"]["accepted"] < result["kill"]["cases"]  # most kills land mid-operation
    assert result["kill"]["outcomes"]["before"] > 0 and result["kill"]["outcomes"]["after"] > 0  # both states seen
    print(f"standing suite: {seconds:.0f} s")  # (its time is the CI log's to show, not a timed test's to judge)
