"""The sections of benchmarks/README.md that weigh results of several kinds against each other: the trained models
(issue 4), the default's choice (issue 13), issue 13's targets for the scaled recipe and issue 30's e5 rows. Which
rows and columns: report.toml; a target is met when the difference reaches it, on the same questions."""

from __future__ import annotations

from typing import Dict, List, Sequence

from .render import CITATION_SETS, SPECS, TEXT, citation_model, commands, diff, fmt, provenance, table

# The rows and columns of the comparisons across kinds (report.toml): a tag "" takes any run another row does not.
TRAINED_ROWS = [(m, t or None, name) for m, t, name in SPECS["trained"]["rows"]]
SUITE = SPECS["suite"]["columns"]
SENTENCE_ENCODED = ("single-vector", "colbert-zeroshot-sent")


def _trained_cell(grouped: Dict[str, List[dict]], benchmark: str, dataset: str, method: str, tag) -> dict | None:
    """The result behind one cell: open-domain rows on the quick protocol, the others whole;
    a tagged run is preferred to an untagged one of the same method."""
    found = [r for r in grouped.get(benchmark, []) if r["dataset"] == dataset and r["method"] == method
             and (tag is None or r.get("tag") == tag)
             and (benchmark != "open_domain" or r.get("first_stage") == "bm25 top-20")]
    if tag is None:  # baselines: any run but one another row names
        claimed = {(m, t) for m, t, _ in TRAINED_ROWS if t}
        found = [r for r in found if (r["method"], r.get("tag")) not in claimed]
    found.sort(key=lambda r: r.get("tag") is not None)
    return found[-1] if found else None


def _gap(a, b, target: float) -> str:
    """a − b against a target margin (met when a − b ≥ target)."""
    if a is None or b is None:
        return "–"
    return f"{diff(a - b)} ({'met' if round(a - b, 2) >= target else 'missed'})"


def _suite_head(full: bool) -> List[str]:
    return table("model | " + " | ".join(d[5 if full else 4] for d in SUITE), [], "")


def _unit_pair(r: dict | None, unit: str, sub_unit: str) -> str:
    return "–" if r is None else f"{fmt(r['metrics'].get(unit))} / {fmt(r['metrics'].get(sub_unit))}"


def _row(name: str, cells: Sequence[str]) -> str:
    return f"| {name} | " + " | ".join(cells) + " |"


def render_trained(grouped: Dict[str, List[dict]]) -> str | None:
    cells = {(row, col): _trained_cell(grouped, b, d, method, tag)
             for row, (method, tag, _) in enumerate(TRAINED_ROWS) for col, (b, d, *_) in enumerate(SUITE)}
    if not any(cells[(row, 0)] for row, (_, tag, _) in enumerate(TRAINED_ROWS) if tag == "agrame-A1"):
        return None
    spec = SPECS["trained"]
    out = ["## " + spec["title"], "", spec["intro"], "", *_suite_head(False)]
    for row, (_, _, name) in enumerate(TRAINED_ROWS):
        values = [_unit_pair(cells[(row, col)], unit, sub) for col, (_, _, unit, sub, *_) in enumerate(SUITE)]
        if any(v != "–" for v in values):
            out.append(_row(name, values))
    out += ["", spec["targets"], "", *table("dataset | A1 − zero-shot passage-level (≥ +8) | A1 − best sentence-encoded "
                                            "(≥ +3) | A1 psg P@1 − passage-loss-only (≥ −1)", [], "")]
    index = {tag or method: row for row, (method, tag, _) in enumerate(TRAINED_ROWS)}

    def metric(key: str, col: int, name: str):
        r = cells[(index[key], col)]
        return None if r is None else r["metrics"].get(name)

    for col, (_, dataset, *_) in enumerate(SUITE[:2]):
        a1 = metric("agrame-A1", col, "sent_p1")
        encoded = [v for v in (metric(m, col, "sent_p1") for m in SENTENCE_ENCODED) if v is not None]
        out.append(_row(dataset, [_gap(a1, metric("zeroshot", col, "sent_p1"), 8),
                                  _gap(a1, max(encoded) if encoded else None, 3),
                                  _gap(metric("agrame-A1", col, "psg_p1"), metric("colbert", col, "psg_p1"), -1)]))
    return "\n".join(out + ["", commands([r for r in cells.values() if r is not None and r.get("tag")])])


DEFAULT_FULL = SPECS["default_choice"]["full"]
DEFAULT_CITATION = ("propositions", "propositions+margin", "propositions+lexical+margin")


def _citation_value(cites: List[dict], model: str, dataset: str, method: str = "propositions") -> float | None:
    """Citation F1 (first label group) of ``method`` for ``model`` on ``dataset``, the latest run."""
    found = [r for r in cites if citation_model(r) == model and r["dataset"] == dataset and method in r["methods"]]
    if not found:
        return None
    methods = found[-1]["methods"]
    return methods[method][next(iter(methods[DEFAULT_CITATION[0]]))]["f1"]


def _citation_f1(cites: List[dict], models: Sequence[str]) -> List[str]:
    """Citation F1 (first label group: ExpertQA complete+missing, WiCE dev) of ``models`` side by side,
    on the datasets every one of them ran; a model with no citation row at all is left out (its rows are not
    in yet), so that it does not hide the others'."""
    by = {(citation_model(r), r["dataset"]): r for r in cites}
    models = [m for m in models if any(key[0] == m for key in by)]
    cite_sets = [d for d in CITATION_SETS if all((m, d) in by for m in models)]
    if len(models) < 2 or not cite_sets:  # one model alone compares with nothing
        return []
    out = ["", TEXT["citation_f1"], "", *table("model | " + " | ".join(
        f"{d} {m}" for d in cite_sets for m in DEFAULT_CITATION), [], "")]
    for model in models:
        vals = []
        for d in cite_sets:
            methods = by[(model, d)]["methods"]
            group = next(iter(methods[DEFAULT_CITATION[0]]))
            vals += [fmt(methods[m][group]["f1"]) if m in methods else "–" for m in DEFAULT_CITATION]
        out.append(_row(model, vals))
    return out


def render_default_choice(grouped: Dict[str, List[dict]]) -> str | None:
    """Issue 13's decision: the default must never be worse than zero-shot MiniLM."""
    full = {(r["tag"], r["dataset"]): r for r in grouped.get("open_domain", [])
            if r.get("first_stage") == "bm25 top-100" and r.get("tag") in dict(DEFAULT_FULL)
            and r["method"] == "colbert-zeroshot-psg"}
    if not any(t == "zeroshot-full" for t, _ in full):
        return None
    spec = SPECS["default_choice"]
    datasets = [d for d in ("squad-dev", "nq-oracle") if any((t, d) in full for t, _ in DEFAULT_FULL)]
    keys = ("psg_p1", "psg_r5", "sent_p1", "sent_r5")
    out = ["## " + spec["title"], "", spec["intro"], "",
           *table("model | " + " | ".join(f"{d} psg P@1 | R@5 | sent P@1 | R@5" for d in datasets), [], "")]
    for tag, name in DEFAULT_FULL:
        out.append(_row(name, [x for d in datasets for x in (
            ["–"] * 4 if (tag, d) not in full else [fmt(full[(tag, d)]["metrics"].get(k)) for k in keys])]))
    cells = []
    for d in datasets:
        a, z = full.get(("shipped", d)), full.get(("zeroshot-full", d))
        cells += ["–"] * 4 if a is None or z is None else [diff(a["metrics"][k] - z["metrics"][k]) for k in keys]
    out += [_row("`squad-a1` − zero-shot", cells), "", spec["suite"], "", *_suite_head(False)]
    # The whole suite (quick protocol for the open-domain sets), as differences to zero-shot.
    for tag, name in spec["suite_rows"]:
        values = []
        for b, d, unit, sub, *_ in SUITE:
            r, z = (_trained_cell(grouped, b, d, "colbert-zeroshot-psg", t) for t in (tag, "zeroshot"))
            values.append("–" if r is None or z is None else
                          f"{diff(r['metrics'][unit] - z['metrics'][unit])} / {diff(r['metrics'][sub] - z['metrics'][sub])}")
        out.append(_row(name, values))
    out += _citation_f1(grouped.get("citation", []), ("zero-shot", "squad-a1"))
    return "\n".join(out + ["", spec["footer"], "", provenance(list(full.values()))])


SCALED = SPECS["scaled"]  # each candidate is held against the passage-loss-only model trained on the same data
SCALED_BASELINES = ("big-colbert", *SCALED["baseline"].values())
TARGETS_HEAD = "target | squad-dev | nq-oracle"


def _questions(r: dict):
    """What makes two rows comparable: the questions, and for a subset the set that defined it."""
    return (r.get("sample", {}).get("questions", r.get("questions")), r.get("taught_abstracts"))


def _full_cell(grouped: Dict[str, List[dict]], benchmark: str, dataset: str, tag: str,
               method: str = "colbert-zeroshot-psg") -> dict | None:
    """One model's full-protocol result (open-domain sets: BM25 top 100 re-ranked); for the multi-vector method a
    tagged run, then the latest; ``zero-shot`` is zero-shot MiniLM's run, tagged or not."""
    found = [r for r in grouped.get(benchmark, []) if r["dataset"] == dataset and r["method"] == method
             and (benchmark != "open_domain" or r.get("first_stage") == "bm25 top-100")
             and (r.get("tag") == tag if tag != "zero-shot" else "all-MiniLM-L6-v2" in str(r.get("model", ""))
                  and r.get("tag") in (None, "zeroshot", "zeroshot-full"))]
    if method == "colbert-zeroshot-psg":
        found.sort(key=lambda r: (r.get("tag") is not None, str(r.get("date", ""))))
    return found[-1] if found else None


def render_scaled(grouped: Dict[str, List[dict]]) -> str | None:
    """Issue 13's targets for the scaled candidate, measured side by side on the full protocol."""
    cells = {(tag, col): _full_cell(grouped, b, d, tag) for tag, _ in SCALED["rows"] for col, (b, d, *_) in enumerate(SUITE)}
    if not any(cells[(tag, col)] for tag in (*SCALED["candidates"], *SCALED_BASELINES) for col in range(len(SUITE))):
        return None
    spec = SPECS["scaled"]
    out = ["## " + spec["title"], "", spec["intro"], "", *_suite_head(True)]
    # e5-small's single vectors (issue 30's rows) beside them: the issue's table has the strongest single-vector
    # model reachable here
    e5 = [_full_cell(grouped, b, d, "e5-small", "single-vector") for b, d, *_ in SUITE]
    for tag, name in SCALED["rows"]:
        out.append(_row(name, [_unit_pair(cells[(tag, col)], unit, sub) for col, (_, _, unit, sub, *_) in enumerate(SUITE)]))
        if tag == "zero-shot" and any(e5):
            out.append(_row("e5-small single vectors (sentences encoded alone)",
                            [_unit_pair(r, unit, sub) for r, (_, _, unit, sub, *_) in zip(e5, SUITE)]))

    def value(tag: str, col: int, key: str):
        r, z = cells[(tag, col)], cells[("zero-shot", col)]
        part, _, key = key.rpartition(":")
        if part:  # a subset the run reports beside the whole set (SciFact's "untaught" claims)
            r, z = r and r.get(part), z and z.get(part)
        if r is None or (z is not None and _questions(r) != _questions(z)):
            return None  # not measured, or not on the same questions as zero-shot's row
        return (r.get("metrics") or {}).get(key)

    measured = [c for c in SCALED["candidates"] if any(cells[(c, col)] for col in range(len(SUITE)))]
    for cand in measured:
        base = SCALED["baseline"].get(cand, "big-colbert")
        out += ["", f"Targets of `{cand}` (it minus the other model, in points; passage loss only: `{base}`):", "",
                *table(TARGETS_HEAD, [], "")]
        for name, key, other, target in SCALED["targets"]:
            other = base if other == "baseline" else other
            out.append(_row(name, [_gap(value(cand, col, key), value(other, col, key), target) for col in (0, 1)]))
        out += ["", *table(f"out of domain: `{cand}` − zero-shot (each ≥ −1) | points", [], "")]
        for col, key, name in SCALED["ood"]:
            out.append(_row(name, [_gap(value(cand, col, key), value("zero-shot", col, key), -1)]))
        for dataset in CITATION_SETS:  # PropCite as `agrame cite` runs it (no margin, no lexical prior)
            f1 = [_citation_value(grouped.get("citation", []), m, dataset) for m in (cand, "zero-shot")]
            if f1[0] is not None:
                out.append(_row(f"citation F1, PropCite, {dataset}", [_gap(f1[0], f1[1], -1)]))
    out += _citation_f1(grouped.get("citation", []), ("zero-shot", *measured))  # one table, candidates side by side
    return "\n".join(out + ["", provenance([r for r in cells.values() if r is not None])])


def render_e5_models(grouped: Dict[str, List[dict]]) -> str | None:
    """Issue 30's rows side by side on the full protocol, and its in-domain targets."""
    cells = {(m, t, col): _full_cell(grouped, b, d, t, m) for m, t, _ in SPECS["e5_models"]["rows"] for col, (b, d, *_) in enumerate(SUITE)}
    if not any(v for (m, t, _), v in cells.items() if t != "zero-shot"):
        return None
    spec = SPECS["e5_models"]
    out = ["## " + spec["title"], "", spec["intro"], "", *_suite_head(True)]
    for m, t, name in spec["rows"]:
        out.append(_row(name, [_unit_pair(cells[(m, t, col)], unit, sub) for col, (_, _, unit, sub, *_) in enumerate(SUITE)]))

    def value(m: str, t: str | None, col: int, key: str):
        r = cells.get((m, t, col))
        return None if r is None else r["metrics"].get(key)

    zs = ("colbert-zeroshot-psg", "zero-shot")

    def best_passage(col: int):
        vals = [v for v in (value(*zs, col, "psg_p1"), value("single-vector", "e5-small", col, "psg_p1")) if v is not None]
        return max(vals) if vals else None

    for name, twin_name in spec["candidates"]:
        cand, twin = ("colbert-zeroshot-psg", name), ("colbert-zeroshot-psg", twin_name)
        if not any(cells.get((*cand, col)) for col in (0, 1)):
            continue
        out += ["", f"Targets of `{name}` (it minus the other row, in points):", "", *table(TARGETS_HEAD, [], ""),
                _row("sentence P@1 − zero-shot MiniLM (≥ +5)",
                     [_gap(value(*cand, c, "sent_p1"), value(*zs, c, "sent_p1"), 5) for c in (0, 1)]),
                _row("sentence P@1 − its passage-only twin (≥ +3)",
                     [_gap(value(*cand, c, "sent_p1"), value(*twin, c, "sent_p1"), 3) if twin_name else
                      "– (no twin trained)" for c in (0, 1)]),
                _row("passage P@1 − the better of zero-shot MiniLM and e5 single vectors (≥ −1)",
                     [_gap(value(*cand, c, "psg_p1"), best_passage(c), -1) for c in (0, 1)]),
                "", *table(f"out of domain: `{name}` − zero-shot MiniLM (each ≥ −1) | points", [], "")]
        for col, key, title in ((3, "sent_p1", "SciFact sentence P@1"), (4, "prop_p1", "atomic-facts proposition P@1"),
                                (2, "psg_p1", "EntityQuestions passage P@1")):
            out.append(_row(title, [_gap(value(*cand, col, key), value(*zs, col, key), -1)]))
    partial = sorted({SUITE[col][5] for (m, t, col), r in cells.items()
                      if r is not None and r.get("granularities") == "passages only"})
    if partial:
        out += ["", "Passages only (no sentence vectors encoded yet, `--passages-only`) in: " + ", ".join(partial) + "."]
    return "\n".join(out + ["", provenance([r for r in cells.values() if r is not None])])
