"""The trained-model table of benchmarks/README.md, from tiny inline results."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.report import render_default_choice, render_scaled, render_trained


def _open(method: str, tag, psg: float, sent: float, first_stage: str = "bm25 top-20") -> dict:
    return {"benchmark": "open_domain", "dataset": "squad-dev", "method": method, "tag": tag,
            "first_stage": first_stage, "metrics": {"psg_p1": psg, "sent_p1": sent},
            "command": f"python -m benchmarks.open_domain --method {method}", "date": "2026-11-22"}


def test_trained_table_rows_and_targets():
    grouped = {"open_domain": [
        _open("colbert-zeroshot-psg", "zeroshot", 77.0, 60.0),
        _open("colbert-zeroshot-sent", "zeroshot", 76.0, 58.0),
        _open("colbert-zeroshot-sent", None, 10.0, 99.0, first_stage="bm25 top-100"),  # another protocol
        _open("single-vector", "s500", 70.0, 57.0),
        _open("colbert-zeroshot-psg", "colbert", 78.0, 55.0),
        _open("colbert-zeroshot-psg", "agrame-A1", 77.5, 69.0),
    ]}
    text = render_trained(grouped)
    assert "| AGRaME A1 (`squad-a1`, the default before issue 13): train and rank [Q'] | 77.5 / 69.0 | – |" in text
    assert "| zero-shot MiniLM, sentences encoded alone | 76.0 / 58.0 |" in text
    assert "AGRaME A3" not in text  # rows without any result are left out
    # +9.0 over zero-shot, +11.0 over the best sentence-encoded (58.0), −0.5 passage P@1 against ColBERT
    assert "| squad-dev | +9.0 (met) | +11.0 (met) | -0.5 (met) |" in text
    assert "| nq-oracle | – | – | – |" in text


def test_trained_table_needs_a_trained_model():
    assert render_trained({"open_domain": [_open("colbert-zeroshot-psg", "zeroshot", 77.0, 60.0)]}) is None


def test_index_search_section_from_inline_results():
    from benchmarks.report import render_index_search

    run = {"benchmark": "index_search", "dataset": "nq-oracle", "first_stage": "agrame compressed index, 2-bit residuals",
           "search": {"nprobe": 4, "ncandidates": 256}, "sample": {"questions": 10, "of": 10, "seed": None},
           "metrics": {"psg_p1": 50.0, "psg_r100": 90.0, "sent_p1": 40.0, "sent_r5": 70.0},
           "agreement_with_exact": {"top100_passage_overlap": 98.5, "same_top1_sentence": 99.0},
           "command": "python -m benchmarks.index_search run", "date": "2026-11-23"}
    bm25 = {"benchmark": "open_domain", "dataset": "nq-oracle", "method": "colbert-zeroshot-psg", "tag": "shipped",
            "first_stage": "bm25 top-100", "sample": {"questions": 10, "of": 10, "seed": None},
            "metrics": {"psg_p1": 49.0, "first_stage_r100": 88.4, "sent_p1": 39.0, "sent_r5": 69.0},
            "command": "python -m benchmarks.open_domain", "date": "2026-11-23"}
    other = {**run, "model": "zero-shot:all-MiniLM-L6-v2"}
    text = render_index_search([run, other], [bm25])
    assert "per hit 1 [model: zero-shot (384-d)] | 10 of 10 | 50.0 |" in text
    assert "| BM25 top-100, re-ranked [shipped] | 10 of 10 | 49.0 | 88.4 (BM25) | 39.0 | 69.0 | – | – |" in text
    assert ("| agrame compressed index, 2-bit residuals, nprobe 4, ncandidates 256, per hit 1 | 10 of 10 | 50.0 | 90.0 "
            "| 40.0 | 70.0 | 98.5 | 99.0 |") in text


def test_index_search_build_time_table():
    from benchmarks.report import render_index_search

    row = {"model": "a", "dim": 128, "pool_tokens": 4000, "encode_seconds_pool_estimate": 10.0, "compress_seconds": 5.0,
           "build_seconds_estimate": 15.0, "ratio_to_first": 1.0}
    r = {"benchmark": "index_search", "what": "build time", "nbits": 2, "threads": 2, "pool_passages": 30,
         "sample": {"passages": 6, "seed": 0}, "protocol": "encode: scaled", "command": "python -m benchmarks.index_search build-time",
         "date": "2026-11-25",
         "models": [row, {**row, "model": "b", "pool_tokens": 5000, "build_seconds_estimate": 30.0, "ratio_to_first": 2.0}]}
    text = render_index_search([r])
    assert "6 of 30 passages sampled (seed 0)" in text
    assert "| a | 128 | 4,000 | 10.0 | 5.0 | 15.0 | 1.0 |" in text and "| b | 128 | 5,000 | 10.0 | 5.0 | 30.0 | 2.0 |" in text


def test_default_choice_section_compares_with_zero_shot():
    def full(tag, dataset, psg, sent):
        return {"benchmark": "open_domain", "dataset": dataset, "method": "colbert-zeroshot-psg", "tag": tag,
                "first_stage": "bm25 top-100", "model": "m", "sample": {"questions": 5},
                "machine": {"cpus": 2, "torch_threads": 2},
                "metrics": {"psg_p1": psg, "psg_r5": 90.0, "sent_p1": sent, "sent_r5": 80.0},
                "command": "python -m benchmarks.open_domain", "date": "2026-11-23"}

    grouped = {"open_domain": [full("zeroshot-full", "squad-dev", 77.0, 66.0), full("shipped", "squad-dev", 76.0, 66.5),
                               _open("colbert-zeroshot-psg", "zeroshot", 77.0, 60.0),
                               _open("colbert-zeroshot-psg", "agrame-A1", 76.0, 61.5)]}
    text = render_default_choice(grouped)
    assert "| zero-shot MiniLM (**the default**) | 77.0 | 90.0 | 66.0 | 80.0 |" in text
    assert "| `squad-a1` − zero-shot | -1.0 | +0.0 | +0.5 | +0.0 |" in text
    assert "| `squad-a1` − zero-shot | -1.0 / +1.5 | – |" in text
    assert render_default_choice({"open_domain": [full("shipped", "squad-dev", 1.0, 1.0)]}) is None


def test_scaled_section_checks_issue_13s_targets():
    def run(benchmark, dataset, tag, unit, sub, questions=100, model="m", first_stage="bm25 top-100"):
        keys = ("sent_p1", "prop_p1") if benchmark == "atomic_facts" else ("psg_p1", "sent_p1")
        return {"benchmark": benchmark, "dataset": dataset, "method": "colbert-zeroshot-psg", "tag": tag,
                "first_stage": first_stage, "model": model, "sample": {"questions": questions},
                "machine": {"cpus": 2, "torch_threads": 2}, "metrics": dict(zip(keys, (unit, sub))),
                "command": f"python -m benchmarks.{benchmark}", "date": "2026-11-24"}

    zs = "zero-shot:all-MiniLM-L6-v2"
    grouped = {"open_domain": [run("open_domain", "squad-dev", "zeroshot-full", 77.8, 66.2, model=zs),
                               run("open_domain", "squad-dev", "zeroshot", 1.0, 1.0, model=zs, first_stage="bm25 top-20"),
                               run("open_domain", "nq-oracle", None, 66.5, 42.8, model="default:all-MiniLM-L6-v2"),
                               run("open_domain", "squad-dev", "big-agrame", 78.0, 72.0),
                               run("open_domain", "squad-dev", "big-colbert", 79.5, 68.0),
                               run("open_domain", "nq-oracle", "big-agrame", 64.0, 49.0, questions=50)],
               "atomic_facts": [run("atomic_facts", "propsegment-dev-wiki", "zeroshot", 50.7, 43.8, model=zs),
                                run("atomic_facts", "propsegment-dev-wiki", "big-agrame", 50.0, 42.9)]}
    text = render_scaled(grouped)
    assert "| zero-shot MiniLM (the default today) | 77.8 / 66.2 | 66.5 / 42.8 | – | – | 50.7 / 43.8 |" in text
    assert "| AGRaME, scaled from the 128-d start, mixed without guard sets (λ = 1) | 78.0 / 72.0 | 64.0 / 49.0 |" in text
    assert "Targets of `big-agrame`" in text and "Targets of `big-agrame-guarded`" not in text
    # nq-oracle's candidate ran on 50 questions, zero-shot on 100: no difference is drawn
    assert "| sentence P@1 − zero-shot (≥ +5) | +5.8 (met) | – |" in text
    assert "| sentence P@1 − passage loss only (≥ +3) | +4.0 (met) | – |" in text
    assert "| passage P@1 − passage loss only (≥ −1) | -1.5 (missed) | – |" in text
    assert "| passage P@1 − zero-shot (≥ −1) | +0.2 (met) | – |" in text
    assert "| atomic-facts proposition P@1 | -0.9 (met) |" in text
    assert "| SciFact sentence P@1 | – |" in text
    assert "e5-small single vectors" not in text  # not measured: no row
    e5 = run("open_domain", "nq-oracle", "e5-small", 69.4, 42.5, model="e5-small")
    e5["method"] = "single-vector"
    grouped["open_domain"].append(e5)
    assert "| e5-small single vectors (sentences encoded alone) | – | 69.4 / 42.5 | – | – | – |" in render_scaled(grouped)
    grouped["open_domain"].pop()
    assert "Citation F1" not in text  # the candidate's citation rows are not in yet

    def cite(dataset, model, tag, f1):
        return {"benchmark": "citation", "dataset": dataset, "model": model, "tag": tag,
                "methods": {m: {"complete+missing": {"f1": f1 + i}} for i, m in
                            enumerate(("propositions", "propositions+margin", "propositions+lexical+margin"))}}

    # The candidate's tagged citation rows beside zero-shot's untagged ones, on the datasets both ran.
    grouped["citation"] = [cite("expertqa-rand_val", zs, None, 40.0), cite("wice-dev", zs, None, 30.0),
                           cite("expertqa-rand_val", "big", "big-agrame", 42.0)]
    text = render_scaled(grouped)
    assert "| model | expertqa-rand_val propositions | expertqa-rand_val propositions+margin |" in text
    assert "| zero-shot | 40.0 | 41.0 | 42.0 |" in text and "| big-agrame | 42.0 | 43.0 | 44.0 |" in text
    assert "wice-dev propositions" not in text
    # the out-of-domain targets carry PropCite's citation F1 as `agrame cite` runs it (no margin)
    assert "| citation F1, PropCite, expertqa-rand_val | +2.0 (met) |" in text
    assert "citation F1, PropCite, wice-dev" not in text  # the candidate did not run it
    grouped["citation"].append(cite("wice-dev", "big", "big-agrame", 28.5))
    assert "| citation F1, PropCite, wice-dev | -1.5 (missed) |" in render_scaled(grouped)
    grouped["citation"].pop()
    # a second candidate measured on the suite but not yet on the citation sets hides no one's rows
    grouped["open_domain"].append(run("open_domain", "squad-dev", "big-agrame-distill", 78.0, 71.0))
    text = render_scaled(grouped)
    assert "| big-agrame | 42.0 | 43.0 | 44.0 |" in text and "| big-agrame-distill |" not in text
    grouped["open_domain"].pop()
    # SciFact's subset on untaught abstracts: a gap only where both runs used the same taught set
    sci = run("cross_domain", "scifact-dev", "big-agrame", 75.0, 50.0, questions=188)
    sci["untaught"] = {"questions": 92, "taught_abstracts": 300, "metrics": {"sent_p1": 44.0}}
    zsci = run("cross_domain", "scifact-dev", "zeroshot", 73.9, 45.2, questions=188, model=zs)
    grouped["cross_domain"] = [sci, zsci]
    text = render_scaled(grouped)
    assert "| SciFact sentence P@1 | +4.8 (met) |" in text
    assert "| ↳ SciFact sentence P@1, dev claims on untaught abstracts | – |" in text
    zsci["untaught"] = {"questions": 92, "taught_abstracts": 300, "metrics": {"sent_p1": 46.0}}
    assert "| ↳ SciFact sentence P@1, dev claims on untaught abstracts | -2.0 (missed) |" in render_scaled(grouped)
    zsci["untaught"]["taught_abstracts"] = 299
    assert "| ↳ SciFact sentence P@1, dev claims on untaught abstracts | – |" in render_scaled(grouped)
    # the guarded candidate gets its own targets, drawn against the same zero-shot rows
    grouped["open_domain"].append(run("open_domain", "squad-dev", "big-agrame-guarded", 78.5, 71.5))
    text = render_scaled(grouped)
    guarded = text[text.index("Targets of `big-agrame-guarded`"):]
    assert "| sentence P@1 − zero-shot (≥ +5) | +5.3 (met) | – |" in guarded
    assert ("| **AGRaME, scaled** (384-d start; WiSE-FT mixed under the guard sets; the candidate default) "
            "| 78.5 / 71.5 |") in text
    assert render_scaled({"open_domain": grouped["open_domain"][:3]}) is None  # no scaled model measured yet
    # the distilled candidate is held against the passage-only model trained on its own data
    grouped["open_domain"] += [run("open_domain", "squad-dev", "big-agrame-distill", 78.0, 70.0),
                               run("open_domain", "squad-dev", "big-colbert-distill", 78.5, 66.0)]
    text = render_scaled(grouped)
    distill = text[text.index("Targets of `big-agrame-distill`"):]
    assert "passage loss only: `big-colbert-distill`" in distill
    assert "| sentence P@1 − passage loss only (≥ +3) | +4.0 (met) | – |" in distill
    assert "| passage P@1 − passage loss only (≥ −1) | -0.5 (met) | – |" in distill
    guarded = text[text.index("Targets of `big-agrame-guarded`"):text.index("Targets of `big-agrame-distill`")]
    assert "| sentence P@1 − passage loss only (≥ +3) | +3.5 (met) | – |" in guarded  # still big-colbert's


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_peak_memory_of_a_child_is_its_own():
    # getrusage's ru_maxrss survives fork and exec on Linux: the scale benchmark's search process
    # reported its parent's build peak as its own until this was read from VmHWM.
    import subprocess
    import sys

    from benchmarks.common import peak_rss_mb

    ballast = bytearray(200 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    parent = peak_rss_mb()
    child = float(subprocess.run([sys.executable, "-c", "from benchmarks.common import peak_rss_mb; print(peak_rss_mb())"],
                                 capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent).stdout)
    assert parent > 200
    assert child < parent - 150


def test_e5_section_takes_single_vector_rows_from_every_benchmark():
    from benchmarks.report import render_e5_models

    def row(benchmark, dataset, method, tag, metrics, model="m", **extra):
        first = {"first_stage": "bm25 top-100"} if benchmark in ("open_domain", "cross_domain") else {}
        return {"benchmark": benchmark, "dataset": dataset, "method": method, "tag": tag, "model": model,
                "metrics": metrics, "sample": {"questions": 5}, "command": f"python -m benchmarks.{benchmark}",
                "machine": {"cpus": 2, "torch_threads": 2},
                "date": "2026-11-25", **first, **extra}

    zs = "zero-shot:all-MiniLM-L6-v2"
    grouped = {
        "open_domain": [row("open_domain", "squad-dev", "colbert-zeroshot-psg", None, {"psg_p1": 77.0, "sent_p1": 66.0}, zs),
                        row("open_domain", "squad-dev", "colbert-zeroshot-psg", "e5-kd-128", {"psg_p1": 74.0, "sent_p1": 63.0}),
                        row("open_domain", "squad-dev", "single-vector", "e5-small", {"psg_p1": 79.0},
                            granularities="passages only")],
        "atomic_facts": [row("atomic_facts", "propsegment-dev-wiki", "single-vector", "e5-small",
                             {"sent_p1": 50.0, "prop_p1": 44.0})]}
    text = render_e5_models(grouped)
    assert "| e5-small single vectors (sentences encoded alone) | 79.0 / – | – | – | – | 50.0 / 44.0 |" in text
    assert "Passages only (no sentence vectors encoded yet, `--passages-only`) in: squad-dev (2,000)." in text
    # the passage target is taken against the better of MiniLM (77.0) and e5's single vectors (79.0)
    assert "| passage P@1 − the better of zero-shot MiniLM and e5 single vectors (≥ −1) | -5.0 (missed) | – |" in text


def test_e5_candidate_without_a_twin_says_so():
    from benchmarks.report import render_e5_models

    def row(tag, metrics, model="m"):
        return {"benchmark": "open_domain", "dataset": "squad-dev", "method": "colbert-zeroshot-psg", "tag": tag,
                "model": model, "metrics": metrics, "sample": {"questions": 5}, "first_stage": "bm25 top-100",
                "command": "python -m benchmarks.open_domain", "machine": {"cpus": 2, "torch_threads": 2},
                "date": "2026-11-26"}

    grouped = {"open_domain": [row(None, {"psg_p1": 77.0, "sent_p1": 66.0}, "zero-shot:all-MiniLM-L6-v2"),
                               row("e5-student-cpu", {"psg_p1": 75.0, "sent_p1": 70.0})]}
    text = render_e5_models(grouped)
    section = text.split("Targets of `e5-student-cpu`")[1]
    assert "| sentence P@1 − zero-shot MiniLM (≥ +5) | +4.0 (missed) | – |" in section
    assert "| sentence P@1 − its passage-only twin (≥ +3) | – (no twin trained) | – (no twin trained) |" in section


def test_every_committed_result_renders(tmp_path):
    """benchmarks/README.md is made from benchmarks/results: a result kind without a renderer (or one
    a renderer cannot read) stops the report, so it is caught here rather than when someone regenerates it."""
    from benchmarks.report import RESULTS, build

    text = build(RESULTS, chart=None)
    assert "## Data safety: hostile probes" in text and "## Crash safety" in text


def test_the_committed_readme_is_what_the_results_render():
    """benchmarks/README.md is the report of benchmarks/results byte for byte: nobody edited a number by hand, and a
    change to the report's specs or code that changes a table shows here (regenerate: python -m benchmarks.report)."""
    from benchmarks.report import REPO, RESULTS, build

    assert build(RESULTS, chart=None) == (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")


def test_cells_formats_and_missing_measures():
    from benchmarks.report import Ctx, fill, table

    ctx = Ctx({"m": {"p": 71.25, "share": 0.5, "k": "K=10", "theta_0.5": {"f1": 3}}, "d": -0.04})
    assert fill("{m[p]:p} {m[share]:%g}% {m[k]:after=} {m[theta_0.5][f1]} {d:+} {m[gone]} {m[gone]:?0}", ctx) == \
        "71.2 50% 10 3 +0.0 – 0"
    assert fill("a sentence about {m[gone]}", ctx, strict=True) is None  # a paragraph on a missing measure is left out
    assert table("a | b", [ctx], "{m[p]} | {d}", "rl") == ["| a | b |", "|---:|---|", "| 71.25 | -0.04 |"]


def test_frontier_rows_show_the_same_index_on_the_reported_splits_at_the_shipped_budget():
    from benchmarks.report import Ctx, _frontier_split, _shipped_per_hit

    shipped = _shipped_per_hit()  # the default model's per_hit (4), not the index format's 5
    assert shipped == 4

    def run(dataset, per_hit, p1, nbits=2, fingerprint="abc", questions=2000):
        return {"dataset": dataset, "fingerprint": fingerprint, "search": {"per_hit": per_hit},
                "first_stage": f"agrame compressed index, {nbits}-bit residuals", "date": "2026-11-26",
                "sample": {"questions": questions}, "metrics": {"psg_p1": p1, "psg_r100": 98.0, "sent_p1": 60.0}}

    results = [run("squad-dev", 10, 70.0), run("squad-dev", shipped, 71.0), run("squad-dev", 5, 69.0),
               run("squad-dev", shipped, 1.0, nbits=4), run("squad-dev", shipped, 2.0, fingerprint="other"),
               run("squad-dev", shipped, 3.0, questions=300),
               run("nq-oracle", 10, 60.0, questions=2655)]
    def split(row):
        return _frontier_split(Ctx(row, all=results))

    assert split({"fingerprint": "abc", "nbits": 2}) == {"squad-dev": "71.0 / 98.0 / 60.0",  # the shipped per_hit preferred
                                                         "nq-oracle": "60.0 / 98.0 / 60.0"}
    assert split({"fingerprint": "abc", "nbits": 1})["squad-dev"] == "–"
    assert split({"fingerprint": "abc", "nbits": 16})["squad-dev"] == "–"
