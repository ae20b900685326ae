"""Regenerate benchmarks/README.md from benchmarks/results/*.json (never edit numbers by hand).

    python -m benchmarks.report

Each result kind has one rendering spec in ``benchmarks/report.toml`` (its header says what the keys mean), drawn by
``render`` here, with Python only for the names a template computes (``DERIVED``), the rows a field cannot give
(``ROWS``) and the tables whose columns come from the data (``TABLES``). The sections that weigh results of several kinds
against each other are in ``benchmarks.comparisons``; the helpers both use in ``benchmarks.render``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Iterable, List

from . import charts
from .common import REPO, RESULTS
from .comparisons import render_default_choice, render_e5_models, render_scaled, render_trained
from .render import (CITATION_SETS, DERIVED, SORTS, SOURCES, SPECS, TEXT, Ctx, label_of, model_label_of, sample_text_of,
                     citation_model, commands, fill, fmt, is_squad_a1, join, method_key, provenance, table)


def _shipped_per_hit() -> int:
    """The default model's ``search.per_hit`` (what an index built with it uses), else the index format's."""
    from agrame.index.format import SearchSettings
    from agrame.loading import DEFAULT_MODEL, named_models

    search = json.loads((named_models()[DEFAULT_MODEL] / "agrame.json").read_text()).get("search") or {}
    return int(search.get("per_hit", SearchSettings().per_hit))


def _frontier_split(c: Ctx) -> Dict[str, str]:
    """A frontier row's index on each reported split: the full-protocol ``index_search run`` of the same model
    (fingerprint) and bit width, at the shipped per_hit where there is one; "–" where none ran."""
    row, out = c["x"], {}
    shipped = _shipped_per_hit()
    for dataset, questions in (("squad-dev", 2000), ("nq-oracle", 2655)):
        runs = [x for x in c["all"] if "what" not in x and x.get("dataset") == dataset and row.get("nbits", 16) < 16
                and x.get("fingerprint") == row["fingerprint"] and x["sample"]["questions"] == questions
                and x.get("first_stage", "").startswith(f"agrame compressed index, {row['nbits']}-bit")]
        x = max(runs, key=lambda x: (x["search"].get("per_hit") == shipped, x.get("date", "")),
                default=None)
        out[dataset] = "–" if x is None else fill("{psg_p1:p} / {psg_r100:p} / {sent_p1:p}", x["metrics"])
    return out


def _ratio(c: Ctx, g: str) -> str:
    single = c["r"]["single_index"][g]["ms_median"]
    return f" ({c['x'][g]['ms_median'] / single:.2f}×)" if single else ""


DERIVED.update({
    "label": lambda c: label_of(c["r"]), "sample_text": lambda c: sample_text_of(c["r"]),
    "model_label": lambda c: model_label_of(c["r"]),
    "labels": lambda c: ", ".join(f"{k} {v}" for k, v in c["sample"]["labels"].items()),
    "uncited": lambda c: "; ".join(f"{k.replace('uncited_', '')} {v}%" for k, v in c["partial_support"].items()
                                   if k.startswith("uncited_")),
    "delete_latencies": lambda c: "; ".join(f"{k} ids: {v['seconds']} s" for k, v in c["delete"].items()),
    "calibration": lambda c: ", ".join(f"{k} {v} s" for k, v in c["calibration_seconds"].items()),
    "first_harness": lambda c: "" if c["r"].get("harness", 1) >= 2 else " " + SPECS["fault"]["first_harness"],
    "failure_text": lambda c: f"{len(c['failures'])}" + (f" ({'; '.join(c['failures'][:3])})" if c["failures"] else ""),
    "status_counts": lambda c: ", ".join(f"{c['statuses'].count(s)} × {s}" for s in sorted(set(c["statuses"]))),
    "leftover_count": lambda c: len(c["leftovers"]),
    "run_label": lambda c: c["key"] if c["key"] == "local" else
    f"{c['key'].replace('_', ' ')} ({c['cpus_per_worker']} CPU each)",
    "same_bytes": lambda c: "—" if c["key"] == "local" else
    ("yes" if c["r"]["identical_bytes_to_local"].get(c["key"]) else "**no**"),
    "sentence_ratio": lambda c: _ratio(c, "sentence"), "passage_ratio": lambda c: _ratio(c, "passage"),
    "exact_cells": lambda c: "; ".join(
        f"{name}: sentence {row['sentence']['strictly_identical']} strictly / {row['sentence']['identical_up_to_ties']} "
        f"up to ties, passage {row['passage']['strictly_identical']} / {row['passage']['identical_up_to_ties']}"
        for name, row in c["rows"].items()),
    "same_bytes_text": lambda c: "the same bytes as" if c["build_identical_bytes_to_local"] else "**other bytes than**",
    "actor_nodes": lambda c: "distinct nodes" if c["r"].get("shard_actors_on_distinct_nodes") else
    "nodes: " + str(c["r"].get("shard_actor_nodes")),
    "libs": lambda c: ", ".join(f"{k} {v}" for k, v in c["libraries"].items()),
    "differences": lambda c: "\n".join(f"- {name}: " + "; ".join(row["differences"]) for name, row in c["models"].items()),
    "size_parts": lambda c: " / ".join(f"{v:.2f}" for v in (
        c["bytes_per_token_by_file"]["codes.bin"], c["bytes_per_token_by_file"]["residuals.bin"],
        sum(c["bytes_per_token_by_file"].get(k, 0.0) for k in ("tokens.bin", "sentence_tokens.bin")),
        sum(v for k, v in c["bytes_per_token_by_file"].items() if k.startswith("ivf-")),
        c["bytes_per_token_by_file"]["centroids.f16"])),
    "index_mb": lambda c: f"{c['index_bytes_text_excluded'] / 1e6:.1f}",
    "index_mib": lambda c: c["memory"]["index_bytes_on_disk"] / 2 ** 20,
    "question_points": lambda c: 100 / int(c["data"].split(", ")[1].split()[0]),
    "loss_text": lambda c: fill("{psg_p1} / {sent_p1}", c[c["part"]["loss"]]) if c[c["part"]["loss"]] else "–",
    "split": _frontier_split,
    "chosen_text": lambda c: "Chosen: " + (fill(c["part"]["chosen"], c) if c["chosen"] else "none meets the rule"),
    "pooled": lambda c: f" (pool factor {c['x']['pool_factor']:g})" if "pool_factor" in c["x"] else "",
    "mark": lambda c: "".join(f" ({g} choice)" for g in ("sentence", "passage") if c["x"] == c["r"].get(f"chosen_{g}")),
    "build_text": lambda c: c["x"]["build_seconds_from_cached_vectors"] or "built before",
    "variants_text": lambda c: "; ".join(
        f"*{name}*: exact stage in chunks of {x['chunk_tokens']:,} tokens, {x['per_hit']} passages scored exactly per "
        "passage hit" for name, x in c["variants"].items()),
    "stage_label": lambda c: c["first_stage"] + (
        fill(", nprobe {search[nprobe]}, ncandidates {search[ncandidates]}, per hit {per_hit}", c,)
        if "search" in c["r"] else "") + (f" [model: {model_label_of(c)}]" if c.get("model") and not is_squad_a1(c) else ""),
    "per_hit": lambda c: c["search"].get("per_hit", 1),
})


def _serve_phases(r: dict, part: dict) -> Iterable[dict]:
    for phase, label in (("plain", "plain"), ("during_add", f"during --add of {r['added_passages']} passages")):
        m = r[phase]
        yield {**m, "label": label, "rounds": f" × {m['rounds']} rounds" if m.get("rounds", 1) > 1 else ""}
    w = r.get("during_writes")
    if w:
        yield {**w, "label": f"during {w['rounds']} HTTP writer rounds ({w['batch']} upserts + a delete each)",
               "rounds": f" × {w['rounds_of_load']} rounds", "throughput_per_s": "–"}


def _suite_parts(r: dict, part: dict) -> Iterable[dict]:
    for name in ("fuzz", "kill", "tamper", "reads"):
        if name in r:
            row = r[name]
            yield {**row, "key": name, "what": part["describe"][name],
                   "accepted_text": "—" if name == "tamper" else f"{row['accepted']:,}",  # (a tamper case is not accepted)
                   "kinds": ", ".join(f"{k} {v:,}" for k, v in row["by_kind"].items())}


def _e5_kinds(r: dict, part: dict) -> Iterable[dict]:
    for kind, texts in (("passages", r["passage_sample"]), ("queries", r["query_sample"])):
        c = r[kind]
        yield {**c, "texts": texts, "met": "met" if c["cosine_min"] >= r["target_cosine_min"] else "**missed**"}


def _export_formats(r: dict, part: dict) -> Iterable[dict]:
    for name, row in r["models"].items():
        for f in ("stanford", "pylate"):
            yield {**row[f], "format": f, "key": name}


def _plaid_systems(r: dict, part: dict) -> Iterable[dict]:
    for key, name in part["systems"].items():
        if key in r["systems"]:
            residuals = r["systems"].get("agrame", {}).get("residuals", "2bit")
            label = name if key == "plaid" or residuals == "2bit" else f"{name}, {residuals} residuals"
            yield {**r["systems"][key], "name": label}


def _pool_rows(r: dict, part: dict) -> Iterable[dict]:
    return sorted(r["rows"], key=lambda x: (x["nbits"], x["pool_factor"]))


def _read_verification_rows(r: dict, part: dict) -> Iterable[dict]:
    rows, ratio = r["rows"], r["ratio_verified_over_mapped"]

    def cell(kind: str, digits: int, target: bool = True) -> str:
        if kind not in ratio:  # (a row this run did not time)
            return "—"
        a, b = rows["mapped"][kind]["median_ms"], rows["verified"][kind]["median_ms"]
        mark = "" if ratio[kind] <= 1.10 or not target else " **over 1.10**"
        return f"{a:.{digits}f} → {b:.{digits}f} ({ratio[kind]:.3f}×){mark}"

    load = r.get("machine", {}).get("load")
    alone = "" if load is None else (" (alone)" if load["alone"] else
                                     f" (not alone: others used {load['other_processes_cpu_cores']} cores)")
    yield {"index": f"{r['passages']:,} of the pool's {r['of_pool']:,} passages, {r['queries']} questions × "
                    f"{r['rounds']} rounds, {r['threads']} thread(s)",
           "passage": cell("passage", 1), "sentence": cell("sentence", 1), "get": cell("get", 3),
           "http_get": cell("GET /passages", 2), "filtered": cell("filtered passage", 1),
           "fresh": cell("fresh filter mask", 1, False), "first": cell("first filter of a generation", 0, False),
           "load": f"{r['load_average_before'][0]}, {r['load_average_after'][0]}{alone}"}


def _alone(r: dict) -> str:
    load = r["machine"]["load"]
    return "alone" if load["alone"] else f"not alone ({load['other_processes_cpu_cores']} cores)"


def _budget_rows(r: dict, part: dict) -> Iterable[dict]:
    for name, row in r["rows"].items():
        chosen = name == f"per_hit {r['chosen_per_hit']}"
        yield {"name": f"**{name}** (chosen)" if chosen else name, **row,
               "data": r["data"], "threads": r["threads"],
               "load": _alone(r)}


def _recall_rows(r: dict, part: dict) -> Iterable[dict]:
    chosen = r["chosen"] and "nprobe {nprobe} · per_hit {per_hit} · prune {prune_factor}".format(**r["chosen"])
    for name, row in r["rows"].items():
        yield {"name": f"**{name}** (chosen)" if name == chosen else name, **row,
               "data": r["data"], "threads": r["threads"],
               "load": _alone(r)}


def _openmp_rows(r: dict, part: dict) -> Iterable[dict]:
    for condition in r["conditions"]:
        load = condition["load"]
        for setting, ms in condition["ms"].items():
            yield {"condition": condition["beside"], "setting": setting, **{k.replace(" ", "_"): v for k, v in ms.items()},
                   "load": f"other processes {load['other_processes_cpu_cores']} cores",
                   "data": f"{r['dataset']}, {r['sample']['questions']} questions, {r['threads']} threads"}


def _verdict_rows(r: dict, part: dict) -> Iterable[dict]:
    for row in r["rows"]:
        base, cand = row["2bit"], row[r["candidate"]]
        yield {"split": row["split"], "questions": row["questions"], "base_p": base["psg_p1"], "base_s": base["sent_p1"],
               "cand_p": cand["psg_p1"], "cand_s": cand["sent_p1"], "base_r": base["psg_r100"], "cand_r": cand["psg_r100"],
               "loss": f"{row['loss_vs_2bit']['psg_p1']} / {row['loss_vs_2bit']['sent_p1']}",
               "within": "yes" if row["within"] else "**no**"}


def _codec_rows(r: dict, part: dict) -> Iterable[dict]:
    for row in r["rows"]:
        loss = row.get("loss_vs_2bit", {})
        name = f"**{row['codec']}** (chosen)" if row["codec"] == r["chosen"] else row["codec"]
        residual = row.get("residual_bytes_per_token")
        yield {"name": name, "residual": "—" if residual is None else f"{residual:g}",
               "bytes": row["bytes_per_original_token"],
               "psg": row["metrics"]["psg_p1"], "sent": row["metrics"]["sent_p1"], "r100": row["metrics"]["psg_r100"],
               "loss": f"{loss.get('psg_p1', '–')} / {loss.get('sent_p1', '–')}",
               "under": "yes" if row["bytes_per_original_token"] <= 20.0 else "no"}


ROWS = {"codec_rows": _codec_rows, "verdict_rows": _verdict_rows, "openmp_rows": _openmp_rows, "budget_rows": _budget_rows, "recall_rows": _recall_rows, "serve_phases": _serve_phases, "read_verification_rows": _read_verification_rows, "suite_parts": _suite_parts, "e5_kinds": _e5_kinds,
        "export_formats": _export_formats, "plaid_systems": _plaid_systems, "pool_rows": _pool_rows}


def _matches(part: dict, r: dict, key: str) -> bool:
    if "if" in part and part["if"] not in r:
        return False
    when, what = part.get("when"), str(r.get(key, ""))
    return when is None or what == when or (what.startswith(when) and what[len(when)] in " :")


def _rows(part: dict, group: List[dict], everything: List[dict]) -> List[Ctx]:
    name = part.get("rows")
    if "order" in part:
        group = sorted(group, key=SORTS[part["order"]])
    if name is None:
        return [Ctx(r, all=everything, part=part) for r in group]
    if name in ROWS:
        return [Ctx(row, r, part=part, all=everything) for r in group for row in ROWS[name](r, part)]
    out = []
    for r in group:
        v = r[name]
        out += [Ctx(x if isinstance(x, dict) else {"value": x}, r, key=k, all=everything, part=part)
                for k, x in (v.items() if isinstance(v, dict) else enumerate(v))]
    return out


def _block(part: dict, group: List[dict], everything: List[dict]) -> List[List[str]]:
    first, last = (Ctx(r, all=everything, part=part) for r in (group[0], group[-1]))
    blocks = []
    for key, ctx in (("heading", first), ("caption", first), ("before", first), ("head", None), ("after", last)):
        if key == "head" and "head" in part:
            blocks.append(table(part["head"], _rows(part, group, everything), part["row"], part.get("align"),
                                part.get("foot")))
        elif key == "head" and "table" in part:
            blocks.append(TABLES[part["table"]](group[0]))
        for template in ([] if key == "head" else [part[key]] if isinstance(part.get(key), str) else part.get(key, [])):
            text = fill(template, ctx, strict=True)
            if text is not None:
                blocks.append([text])
    if "source_each" in part:
        blocks.append([SOURCES[part["source_each"]](group)])
    return blocks


def render(kind: str, results: List[dict], spec: dict | None = None, extra=None) -> str:
    """One section from its spec; ``extra(results)`` adds blocks of a kind's own before the spec's parts."""
    spec = spec or SPECS[kind]
    blocks = [["## " + spec["title"]]] + ([[spec["intro"]]] if "intro" in spec else [])
    if extra:
        blocks += extra(results)
    for part in spec.get("parts", [spec]):
        chosen = [r for r in results if _matches(part, r, spec.get("key", "what"))]
        if "sort" in part:
            chosen.sort(key=SORTS[part["sort"]])
        per = part.get("per", "result" if "parts" in spec else "all")
        if per == "dataset":
            groups = [[r for r in chosen if r["dataset"] == d] for d in sorted({r["dataset"] for r in chosen})]
        else:
            groups = [[r] for r in chosen] if per == "result" else [chosen] if chosen else []
        for group in groups:
            blocks += _block(part, group, results)
    if "source" in spec:
        blocks.append([SOURCES[spec["source"]](sorted(results, key=SORTS[spec["sort"]]) if "sort" in spec else results)])
    return join(blocks + ([[]] if spec.get("end_blank") else []))


def _speed_lines(r: dict, part: dict) -> Iterable[dict]:
    """The measures of a speed run: each of ``lines``; ``*FIELD`` is one line per item of its metrics' FIELD."""
    for template in part["lines"]:
        items = r["metrics"][template[1:]].items() if template.startswith("*") else [(None, None)]
        for k, v in items:
            yield {"line": fill(part["lines_each"] if k else template,
                                Ctx({"key_words": k and k.replace("_", " "), "value": v}, r))}


def _cases(r: dict, rows: dict, head: str, cell=lambda x: f"{x['median']} / {x['p95']}") -> List[str]:
    """A latency table whose columns are the cases of its first row: ``head`` then one cell per case."""
    cases = list(next(iter(rows.values())))
    lines = table(head + " | " + " | ".join(f"{c} median / p95 ms" for c in cases), [], "")
    return lines + [f"| {name} | " + " | ".join(cell(row[c]) for c in cases) + " |" for name, row in rows.items()]


def _engine_table(r: dict) -> List[str]:
    first, rows = next(iter(r["ms_search_only"])), r["ms_search_only"]
    return _cases(r, rows, "engine") + [f"| ratio {first} / {name} (median) | " + " | ".join(
        f"{ratio[c]}×" for c in next(iter(rows.values()))) + " |" for name, ratio in r["ratio_shipped_over"].items()]


def _candidates_table(r: dict) -> List[str]:
    budgets = list(next(iter(r["recall_of_exact_top10"].values())))
    lines = table("method | " + " | ".join(f"recall @ {n}" for n in budgets) + " | ms (128)", [], "")
    return lines + [f"| {name} | " + " | ".join(f"{row[n]}" for n in budgets) + f" | {r['ms_candidates_128'][name]} |"
                    for name, row in r["recall_of_exact_top10"].items()]


def _pool_latency_table(r: dict) -> List[str]:
    ratios = next(v for k, v in r.items() if k.startswith("ratio_to_factor_"))
    lines = _cases(r, r["ms_search_only"], "pool factor")
    lines[0] = lines[0][:-2] + " | × factor 1 (medians) |"
    lines[1] = "|---:|" + lines[1][5:] + "---:|"
    return lines[:2] + [line + " " + " / ".join(str(ratios[f][c]) for c in r["ms_search_only"][f]) + " |"
                        for line, f in zip(lines[2:], r["ms_search_only"])]


ROWS["speed_lines"] = _speed_lines
TABLES = {"engine": _engine_table, "candidates": _candidates_table, "pool_latency": _pool_latency_table}


def render_open_domain(results: List[dict]) -> str:
    """Per dataset; runs that also report their answerable questions alone add four columns."""
    spec = SPECS["open_domain"]

    def blocks(results):
        out = []
        for dataset in sorted({r["dataset"] for r in results}):
            group = sorted((r for r in results if r["dataset"] == dataset), key=method_key)
            more = any("metrics_answerable" in r for r in group)
            part = {**spec, "head": spec["head"] + (" | " + spec["answerable_head"] if more else "") + " | ms/q",
                    "row": spec["row"] + (" | " + spec["answerable_row"] if more else "") + " | {ms_per_question}"}
            out += _block(part, group, results)
        return out

    return render("open_domain", results, {**spec, "parts": []}, extra=blocks)


CITATION_METHODS = SPECS["citation"]["methods"]


def render_citation(results: List[dict]) -> str:
    spec = SPECS["citation"]
    several = len({r["dataset"] for r in results}) < len(results)  # a dataset run with more than one model

    def blocks(results):
        out = []
        for r in sorted(results, key=lambda r: ((CITATION_SETS + (r["dataset"],)).index(r["dataset"]), is_squad_a1(r),
                                                r.get("tag") or "")):
            groups = list(next(iter(r["methods"].values())))
            lines = table("method | " + " | ".join(f"{g} P / R / F1" for g in groups) + " | unsupported uncited", [], "")
            for method in (m for m in CITATION_METHODS if m in r["methods"]):
                row = r["methods"][method]
                lines.append(f"| {method} | " + " | ".join(
                    fill("{precision} / {recall} / **{f1}**" if g == groups[0] else "{precision} / {recall} / {f1}",
                         row[g]) for g in groups) + f" | {fmt(row[groups[0]]['uncited_unsupported'])} |")
            after = fill(spec["after"], Ctx(r), strict=True)
            out += [[f"### {r['dataset']} ({citation_model(r)})" if several else f"### {r['dataset']}"],
                    [fill(spec["caption"], Ctx(r))], lines, *([[after]] if after else []), [provenance([r])]]
        return out

    return render("citation", results, {**spec, "parts": [], "end_blank": True}, extra=blocks)


def render_index_search(results: List[dict], open_domain: List[dict] | None = None) -> str:
    """The spec's parts, after the runs over the whole pool (no ``what``), per dataset with BM25's rows first."""
    spec = SPECS["index_search"]

    def blocks(results):
        out = []
        runs = [r for r in results if "what" not in r]
        for dataset in sorted({r["dataset"] for r in runs}):
            rows = sorted((r for r in runs if r["dataset"] == dataset),
                          key=lambda r: (r["first_stage"] != "exhaustive exact scan (float16 vectors)", r["first_stage"]))
            bm25 = [r for r in open_domain or [] if r["dataset"] == dataset and r.get("tag") == "shipped"
                    and r.get("first_stage") == "bm25 top-100" and r["method"] == "colbert-zeroshot-psg"]
            lines = table(spec["runs_head"], [Ctx(r) for r in bm25], spec["bm25_row"], "ll")
            for r in rows:
                lines += ["| " + fill(spec["run_row"], Ctx(r)) + " |"]
                if "metrics_on_exact_sample" in r:
                    lines += ["| " + fill(spec["sample_row"], Ctx(r)) + " |"]
            out += [[f"### {dataset}"], lines, [commands(rows + bm25)]]
        return out

    return render("index_search", results, extra=blocks)


def render_shipping(results_dir: Path) -> str | None:
    """The shipping rule (issue 51), row by row for the default model."""
    from agrame.loading import DEFAULT_MODEL

    from . import shipping

    if not list(results_dir.glob("*-ship-*.json")):
        return None
    spec = SPECS["shipping"]
    rule = shipping.__doc__.split("The rule", 1)[1].split("Rows:", 1)[0].strip()
    blocks = [["## " + spec["title"]], ["The rule " + rule], [spec["intro"].format(model=DEFAULT_MODEL)],
              [shipping.render(DEFAULT_MODEL, results_dir)]]
    for candidate, text in spec.get("successors", {}).items():
        if list(results_dir.glob(f"*-ship-{candidate}.json")):
            blocks += [["### " + text["title"]], [text["intro"].format(model=DEFAULT_MODEL)],
                       [shipping.render(candidate, results_dir, reference=DEFAULT_MODEL, gain=1)],
                       [text["after"].format(model=DEFAULT_MODEL)]]
    return join(blocks)


SPECIAL = (render_default_choice, render_scaled, render_e5_models, render_trained)  # over every kind's results
RENDERERS: Dict[str, Callable[[List[dict]], str]] = {
    kind: {"open_domain": render_open_domain, "citation": render_citation}.get(kind, lambda rs, k=kind: render(k, rs))
    for kind in ("evidence", "open_domain", "cross_domain", "atomic_facts", "marker_choice", "speed", "segmentation",
                 "citation", "citation-latency", "teachers", "serve_load", "lifecycle", "fault", "hardening", "safety",
                 "safety-suite", "read-verification", "plaid-budget", "plaid-recall", "recall_misses", "openmp_wait", "residual_codecs", "scale_out", "e5", "export_parity", "batch_search",
                 "pool_methods", "against_commit")}


def build(results_dir: Path = RESULTS, chart: Path | None = None) -> str:
    grouped = defaultdict(list)
    for path in sorted(results_dir.glob("*.json")):
        result = json.loads(path.read_text())
        grouped[result["benchmark"]].append(result)
    sections = [TEXT["header"], render_shipping(results_dir)]
    if charts.sentence_points(grouped):
        sections.append("![sentence-level P@1 per method and dataset](sentence_p1.png)")
    if chart is not None:
        charts.sentence_chart(grouped, chart, method_key)
        charts.frontier_chart(grouped, chart.with_name("frontier.png"))
        charts.pooling_chart(grouped, chart.with_name("pooling.png"))
    sections += [render_special(grouped) for render_special in SPECIAL]
    sections += [render(grouped[name]) for name, render in RENDERERS.items() if grouped.get(name)]
    if grouped.get("index_search"):
        sections.append(render_index_search(grouped["index_search"], grouped.get("open_domain", [])))
    if grouped.get("plaid"):
        sections.append(render("plaid", grouped["plaid"]))
    unknown = sorted(set(grouped) - set(RENDERERS) - {"index_search", "plaid"})
    if unknown:
        raise SystemExit(f"error: no renderer for result kinds {unknown}")
    return "\n\n".join(s for s in sections if s) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "README.md"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = build(Path(args.results), chart=out.parent / "sentence_p1.png")
    tmp = out.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
