"""agrame sets OpenMP's wait policy before torch loads (issue 64: spinning threads made search 2.5-5x slower on a
loaded machine), keeps a value the user set, and leaves a process that loaded torch first as it is."""

from __future__ import annotations

import os
import subprocess
import sys


def _policy(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code + "; import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                         env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_agrame_imported_first_makes_openmp_threads_sleep_between_regions():
    assert _policy("import agrame, torch") == "PASSIVE"
    assert _policy("import agrame_app.cli") == "PASSIVE"  # the CLI and the server
    assert _policy("import benchmarks.plaid") == "PASSIVE"  # benchmarks import torch before agrame in their modules


def test_a_users_choice_and_an_earlier_torch_are_left_alone():
    assert _policy("import agrame", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _policy("import torch, agrame") == "None"
