"""The report's helpers: its specs (report.toml), the cell formats and names of its templates, tables and
provenance lines, and the labels of a result. benchmarks.comparisons and benchmarks.report draw with them."""

from __future__ import annotations

import json
import re
import string
import tomllib
from pathlib import Path
from typing import Callable, Dict, Iterable, List

SPECS = tomllib.loads(Path(__file__).with_name("report.toml").read_text(encoding="utf-8"))
TEXT = SPECS["text"]


class _Missing(Exception):
    pass


class Cells(string.Formatter):
    """``str.format`` with the report's cell formats. A field is a path of keys, ``{metrics[psg_p1]}`` or
    ``{x[theta_0.5][f1]}`` (brackets may hold dots); a missing key or None is "–" in a table cell, and leaves a
    paragraph out (``strict``). Formats beyond Python's: ``p`` one decimal, ``+`` a signed difference with one
    decimal, ``%`` then a format: a share times 100, ``after=``: the text after the first "=", ``?`` then a text: that
    text where the measure is missing."""

    def __init__(self, strict: bool = False):
        self.strict = strict

    def get_field(self, name, args, kwargs):
        obj = kwargs
        for bracket, plain in re.findall(r"\[([^\]]*)\]|([^.\[\]]+)", name):
            key = bracket or plain
            obj = obj[key] if isinstance(obj, Ctx) else obj.get(key) if isinstance(obj, dict) else None
        return obj, name

    def format_field(self, value, spec: str) -> str:
        if spec.startswith("?"):  # a default for a measure older runs lack
            return spec[1:] if value is None else format(value)
        if value is None:
            if self.strict:
                raise _Missing
            return "–"
        if spec == "p":
            return f"{value:.1f}"
        if spec == "+":
            return diff(value)
        if spec.startswith("%"):
            return format(100 * value, spec[1:])
        if spec == "after=":
            return str(value).split("=", 1)[1]
        return format(value, spec)


# Names a template may use beyond its result's fields, each computed from the template's Ctx (report.py fills it).
DERIVED: Dict[str, Callable[["Ctx"], object]] = {}


class Ctx(dict):
    """A template's names: a row's fields over its result's, ``r`` (the result), ``x`` (the row), ``key`` (the row's
    key where the rows were a dict), ``part`` (its spec), ``all`` (every result of the kind), and the names of
    ``DERIVED``, computed when a template asks for them."""

    def __init__(self, row: dict, result: dict | None = None, **extra):
        result = row if result is None else result
        super().__init__({**result, **row, "r": result, "x": row, **extra})

    def __missing__(self, key):
        fn = DERIVED.get(key)
        try:
            return None if fn is None else fn(self)
        except KeyError:
            return None


def fill(template: str, ctx: dict, strict: bool = False) -> str | None:
    try:
        return Cells(strict).vformat(template, (), ctx)
    except _Missing:
        return None


def table(head: str, rows: Iterable[dict], row: str, align: str | None = None, foot: str | None = None) -> List[str]:
    n = len(head.split(" | "))
    align = (align or "l").ljust(n, "r")
    return ["| " + head + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in align),
            *("| " + fill(row, x) + " |" for x in rows), *(["| " + fill(foot, rows[-1]) + " |"] if foot else [])]


def join(blocks: Iterable[List[str]]) -> str:
    lines: List[str] = []
    for i, block in enumerate(blocks):
        lines += ([""] if i else []) + block
    return "\n".join(lines)


def diff(x: float) -> str:
    x = round(x, 1)
    return f"{x if x != 0 else 0.0:+.1f}"  # no "-0.0"


def fmt(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def provenance(results: List[dict]) -> str:
    return "\n".join(f"- `{r['command']}` — model `{r['model']}`, sample {json.dumps(r['sample'])}, "
                     f"{r['machine']['cpus']} CPUs / {r['machine']['torch_threads']} torch threads, {r['date']}"
                     for r in results)


def commands(results: List[dict]) -> str:
    """Provenance for results without a model or sample of the usual shape."""
    return "\n".join(f"- `{r['command']}`, {r['date']}" for r in results)


SOURCES = {"provenance": provenance, "commands": commands}
CITATION_SETS = ("expertqa-rand_val", "expertqa-domain_val", "wice-dev")

METHOD_ORDER = ["bm25", "single-vector", "colbert-zeroshot-sent", "colbert-zeroshot-psg", "subencoder",
                "subencoder-zeroshot"]


def method_key(r: dict):
    name = r["method"]
    return (METHOD_ORDER.index(name) if name in METHOD_ORDER else len(METHOD_ORDER), name, str(r.get("tag") or ""),
            str(r.get("model")))


SORTS: Dict[str, Callable[[dict], object]] = {
    "method": method_key, "dataset_method": lambda r: (r["dataset"], method_key(r)), "kind": lambda r: r["kind"],
    "tag": lambda r: str(r.get("tag")), "factor": lambda r: r["factor"], "nbits": lambda r: (isinstance(r["nbits"], str), str(r["nbits"]).zfill(8)),
    "tokens": lambda r: r["tokens"]}


def label_of(r: dict) -> str:
    """Method name, with the run's tag (a trained model's name) and a non-default first stage."""
    label = r["method"] + (f" [{r['tag']}]" if r.get("tag") else "")
    if r.get("first_stage", "bm25 top-100") != "bm25 top-100":
        label += f" ({r['first_stage']})"
    return label


def sample_text_of(r: dict) -> str:
    s = r["sample"]
    return f"{s['questions']:,} of {s['of']:,}" + (f" (seed {s['seed']})" if s.get("seed") is not None else "")


def is_squad_a1(r: dict) -> bool:
    return r.get("fingerprint", "") == "e0baae1261ed" or str(r.get("model", "")).startswith(("default:agrame",
                                                                                          "squad-a1"))


def model_label_of(r: dict) -> str:
    if is_squad_a1(r):
        return "squad-a1"
    return "zero-shot (384-d)" if str(r.get("model", "")).startswith("zero-shot:") else str(r.get("model", "?"))


def citation_model(r: dict) -> str:
    """The name a citation run is shown under: its tag, else squad-a1 / zero-shot / the model's own name."""
    if r.get("tag"):
        return r["tag"]
    return "squad-a1" if is_squad_a1(r) else "zero-shot" if "zero-shot" in str(r["model"]) else str(r["model"])
