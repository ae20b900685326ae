"""Shared benchmark plumbing: where the data lives, loading, result files."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from agrame.datasets import DataError, data_path, sample, sentence_of, squad_paragraphs  # noqa: F401 (re-exported)
from agrame.datasets import data_dir as _data_dir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def data_dir() -> Path:
    """:func:`agrame.datasets.data_dir`, or exit with its message (a benchmark's command line)."""
    try:
        return _data_dir()
    except DataError as exc:
        sys.exit(f"error: {exc}")


def cpu_model() -> str:
    """The CPU's name (/proc/cpuinfo's "model name"; platform.processor() elsewhere): float32 results can move by
    an ulp between CPUs (issue 64's two-thread test passed on one and not on an AMD EPYC), latencies more."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    import torch
    return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
            "load": machine_load()}


def _cpu_seconds() -> Tuple[float, float]:
    """(busy CPU seconds of the whole machine, of this process and its waited-for children) since boot / start."""
    busy = 0.0
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


#: when this module was imported (a benchmark's start, near enough): the machine's and this process's CPU then
_STARTED = (time.time(), *_cpu_seconds(), os.getloadavg())
#: another job's CPU above this many cores, on average over the run, makes it "not alone" (issue 64)
NOT_ALONE_CORES = 0.25


def load_snapshot() -> tuple:
    """A starting point for :func:`machine_load` (a part of a run, e.g. one condition of several)."""
    return (time.time(), *_cpu_seconds(), os.getloadavg())


def machine_load(since: Optional[tuple] = None) -> dict:
    """What else ran while this benchmark did (issue 64: a loaded machine doubled one side's latency and no run said
    so): the load average when it started and now, and the CPU the *other* processes used meanwhile, in cores
    (the machine's busy CPU time minus this process's and its children's, over the wall time). A child is
    counted as this run's once waited for: workers it leaves running (Ray's) count as other processes."""
    began, busy0, own0, load0 = _STARTED if since is None else since
    busy1, own1 = _cpu_seconds()
    wall = max(time.time() - began, 1e-6)
    others = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return {"load_average_at_start": [round(x, 2) for x in load0],
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "other_processes_cpu_cores": round(others, 2), "seconds": round(wall, 1),
            "alone": others <= NOT_ALONE_CORES}


#: A second job that keeps ``threads`` cores busy (issue 64: "with a second 2-thread job beside it"): float32
#: matrix products in torch, as a neighbour's encoding or training would run.
_BUSY_JOB = ("import torch, sys; torch.set_num_threads(int(sys.argv[1])); a = torch.randn(768, 768)\n"
             "while True:\n    a = torch.tanh(a @ a)")


@contextlib.contextmanager
def busy_beside(threads: int = 2):
    """Run the block with a second ``threads``-thread job beside it (a child process, ended on exit); yields its
    description for the result file. ``threads`` 0: nothing beside (yields None)."""
    if not threads:
        yield None
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    # Started through a launcher that exits at once: the job is not this process's child, so its CPU time counts
    # as another process's in machine_load (a child waited for would count as this run's own).
    launcher = ("import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], "
                "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True).pid)")
    pid = int(subprocess.run([sys.executable, "-c", launcher, _BUSY_JOB, str(threads)], env=env, check=True,
                             capture_output=True, text=True).stdout)
    try:
        time.sleep(1.0)  # (torch's import: the load starts before the first timing)
        yield f"a {threads}-thread job beside it (torch float32 768×768 matrix products in a loop, pid {pid})"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process in MB: its address space's high-water mark (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across fork and exec, so a child started by
    a process that had grown large (the scale benchmark's build, then its search) would report the
    parent's peak as its own.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    if pid != "self":
        return float("nan")  # another process's peak is only known through /proc
    import resource  # not Linux: the best there is (kB on Linux, bytes on macOS; only Linux runs this)

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def add_model_args(parser, alpha_help: str = "α in S'(q,s) + α·S(q,p) (default: the model's)",
                   alpha_default=None) -> None:
    """Options every ranking benchmark shares: sample, models, output file."""
    parser.add_argument("--limit", type=int, default=None, help="questions sampled (fixed seed); default all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="multi-vector model folder or shipped name (default: the package default, gpu2100-agrame128)")
    parser.add_argument("--alpha", type=float, default=alpha_default, help=alpha_help)
    parser.add_argument("--baseline-model", default=None,
                        help="Hugging Face folder for the single-vector/SubEncoder baselines (default: MiniLM)")
    parser.add_argument("--span-query-marker", choices=("Q", "Q'"), default=None,
                        help="marker of the sub-unit query, overriding the model's (ablation A2)")
    parser.add_argument("--tag", default=None,
                        help="label of this run (e.g. a trained model's name): kept in the result and its file name")
    parser.add_argument("--out", default=None, help="result file (default: benchmarks/results/<name>.json)")


def tagged(name: str, tag: Optional[str]) -> str:
    """A result file's name: the benchmark's, then the run's tag."""
    return f"{name}-{tag}" if tag else name


def command_line(module: str, argv: Optional[Sequence[str]]) -> str:
    """The command that reproduces a run: ``python -m <module> <the arguments parsed>``."""
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", "-m", module, *args])


def write_result(name: str, result: dict, out: Optional[str], command: str) -> Path:
    """Write ``result`` with its command and machine to ``benchmarks/results/<name>.json`` (atomically)."""
    result = {**result, "command": command, "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    load = result["machine"]["load"]
    if not load["alone"]:
        print(f"note: {name}: this run was not alone — other processes used {load['other_processes_cpu_cores']} "
              f"cores on average over its {load['seconds']} s (load average {load['load_average_at_start'][0]} at "
              f"its start, {load['load_average_at_end'][0]} at its end); its timings are not an idle machine's",
              file=sys.stderr)
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def tiny_encoder(doc_maxlen: int = 24, query_maxlen: int = 8, dim: Optional[int] = 16, seed: int = 0):
    """A tiny randomly initialised BERT that encodes in milliseconds (the tests' model, and the
    standing safety suite's: what it checks is the store, not the ranking)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from agrame.encoder import Encoder, EncoderSettings
    from agrame.backbones import default_model_path

    torch.manual_seed(seed)
    # The real MiniLM vocabulary keeps tokenisation (unicode, word pieces, offsets) realistic.
    tokenizer = BertTokenizerFast(vocab_file=str(default_model_path() / "vocab.txt"), do_lower_case=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    backbone = BertModel(config, add_pooling_layer=False)
    projection = torch.nn.Linear(32, dim, bias=False) if dim else None
    settings = EncoderSettings(dim=dim, doc_maxlen=doc_maxlen, doc_overlap=6, query_maxlen=query_maxlen)
    return Encoder(backbone, tokenizer, settings, projection, source="tiny-test-bert")
