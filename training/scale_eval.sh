#!/usr/bin/env bash
# Issue 13's full protocol for the models training/scale.sh makes, beside zero-shot MiniLM (whose
# rows of the same protocol are already in benchmarks/README.md, tag zeroshot-full / run_all.sh):
#   big-agrame-guarded  the default candidate: the multi-granular student from zero-shot's 384-d vectors,
#                       WiSE-FT mixed under the guard sets (export/guarded), as it would ship (`agrame`)
#   big-agrame          the first candidate: 128-d start, mixed without guard sets (λ = 1; its folders are
#                       in big/first-128 since the start changed)                     (`agrame-unguarded`)
#   big-colbert         the passage-loss-only baseline, trained and mixed like the candidate (`colbert`)
#   big-agrame-distill  the candidate trained with self-distillation, DISTILL=1 M=$R/distill (`agrame-distill`)
#   big-colbert-distill its passage-loss-only baseline on the same data (`colbert-distill`)
# Open domain: squad-dev 2,000 questions (seed 0), nq-oracle all 2,655, EntityQuestions 1,000 (seed 0),
# BM25 top 100 re-ranked; SciFact dev (with the subset of claims on abstracts SciFact train did not
# teach, for zero-shot too) and the atomic facts whole; citation (ExpertQA rand_val /
# domain_val, WiCE dev) for the candidate only. Each model encodes the 33.6k-passage pool once
# (cached under $AGRAME_CACHE): ~1 h per model on 2 CPU cores, citation ~1 h more. Resumable at the granularity of a
# benchmark: a finished one is skipped when its result file exists (delete those of a model trained again).
#   bash training/scale_eval.sh              # both; `… agrame` as soon as the candidate is exported
#   RUN=echo bash training/scale_eval.sh     # print the commands only
#   GUARDS=2000 bash training/scale_eval.sh agrame-distill   # the models mixed under larger guard sets
#                                            # (scale.sh GUARDS=2000: export/guarded2000; tags end in -g2000)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${AGRAME_RUNS:-runs}/big
RUN=${RUN:-}
# Where finished rows are looked for (the benchmarks always write to benchmarks/results; a dry run in
# the tests points this at an empty folder, so committed rows do not hide the commands).
res=${RESULTS:-benchmarks/results}
. training/guards.sh  # the guard sets the models were mixed under (training/scale.sh GUARDS)

scifact() {  # scifact TAG MODEL: SciFact dev, and its claims on abstracts SciFact train did not teach
  grep -qs '"untaught"' "$res/cross_domain-scifact-dev-colbert-zeroshot-psg-$1.json" ||
    $RUN python -m benchmarks.cross_domain --dataset scifact --method colbert-zeroshot-psg --model "$2" --tag "$1" \
      --taught "$R/scifact.jsonl"
}
need() {  # need MODEL: a model folder that is not there ends the run before any benchmark starts
  [ -n "$RUN" ] || [ -e "$1" ] || { echo "scale_eval: $1 not found (run training/scale.sh first)" >&2; exit 2; }
}
bench() {  # bench TAG MODEL
  local tag=$1 model=$2
  need "$model"
  for spec in "squad-dev --limit 2000 --seed 0" "nq-oracle" "entityquestions --limit 1000 --seed 0"; do
    set -- $spec
    [ -s "$res/open_domain-$1-colbert-zeroshot-psg-$tag.json" ] ||
      $RUN python -m benchmarks.open_domain --dataset $spec --method colbert-zeroshot-psg --model "$model" --tag "$tag"
  done
  scifact "$tag" "$model"
  [ -s "$res/atomic_facts-colbert-zeroshot-psg-$tag.json" ] ||
    $RUN python -m benchmarks.atomic_facts --method colbert-zeroshot-psg --model "$model" --tag "$tag"
}
candidate() {  # candidate TAG MODEL: the suite and the citation rows
  local tag=$1 model=$2 split name
  local -a dataset
  bench "$tag" "$model"
  # rand_val first: it chooses the margin and λ that the other two splits use
  # (tagged: the default's own citation rows stay beside them).
  for split in rand_val domain_val wice; do
    if [ "$split" = wice ]; then dataset=(wice); name=wice-dev; else dataset=(expertqa --split "$split"); name=expertqa-$split; fi
    [ -s "$res/citation-$name-$tag.json" ] ||
      $RUN python -m benchmarks.citation --dataset "${dataset[@]}" --model "$model" --tag "$tag"
  done
}
index_rows() {  # index_rows TAG MODEL: a 128-d candidate's compressed-index rows (issue 39): bytes per token,
  # P@1 / R@100 over the whole pool, sentence-search latency, beside colbert-ai PLAID at k = 10 / 100, build time
  # against zero-shot's. The timings (latency, plaid, build-time) are for a machine with nothing else running.
  local tag=$1 model=$2
  need "$model"
  [ -s "$res/index_search-size-2b-$tag.json" ] ||
    $RUN python -m benchmarks.index_search build --nbits 2 --model "$model" --tag "$tag"
  [ -s "$res/index_search-nq-oracle-agrame-2b-$tag.json" ] ||
    $RUN python -m benchmarks.index_search run --dataset nq-oracle --first-stage agrame --nbits 2 --model "$model" --tag "$tag"
  [ -s "$res/index_search-squad-dev-agrame-2b-s2000-$tag.json" ] ||
    $RUN python -m benchmarks.index_search run --dataset squad-dev --limit 2000 --first-stage agrame --nbits 2 \
      --model "$model" --tag "$tag"
  [ -s "$res/index_search-latency-2b-$tag.json" ] ||
    $RUN python -m benchmarks.index_search latency --nbits 2 --threads 2 --model "$model" --tag "$tag"
  [ -s "$res/plaid-nq-oracle-$tag.json" ] ||
    $RUN python -m benchmarks.plaid --model "$model" --dataset nq-oracle --threads 2 --tag "$tag"
  local name; name=$(basename "$model" | tr .- __)
  [ -s "$res/index_search-build-time-zero_shot-vs-$name.json" ] ||
    $RUN python -m benchmarks.index_search build-time --models zero-shot "$model" --passages 1000 --threads 1
}
# zero-shot's SciFact row again with the same taught set (its other rows are already in the repo)
scifact zeroshot zero-shot
for what in ${*:-agrame colbert}; do
  case $what in
    agrame) candidate "big-agrame-guarded$sfx" "$R/export/$G" ;;
    # the first candidate, mixed without guard sets (λ = 1; its rows are committed)
    agrame-unguarded) candidate big-agrame "$R/first-128/export/default" ;;
    colbert) bench "big-colbert$sfx" "$R/colbert-$G" ;;
    agrame-distill) candidate "big-agrame-distill$sfx" "$R/distill/export/$G" ;;
    # its passage-loss-only baseline, the same data (DISTILL=1 M=$R/distill bash training/scale.sh, without ONLY)
    colbert-distill) bench "big-colbert-distill$sfx" "$R/distill/colbert-$G" ;;
    # the GPU-trained students of ../shared/models, mixed by training/gpu_students.sh (issue 39)
    gpu-agrame) candidate "gpu-agrame$sfx" "$R/gpu/export/gpu2100-agrame-$G" ;;
    gpu-agrame128) candidate "gpu-agrame128$sfx" "$R/gpu/export/gpu2100-agrame128-$G" ;;
    gpu-agrame128-index) index_rows "gpu-agrame128$sfx" "$R/gpu/export/gpu2100-agrame128-$G" ;;
    gpu-colbert) bench "gpu-colbert$sfx" "$R/gpu/gpu2100-colbert-$G" ;;
    *) echo "scale_eval: unknown model '$what' (agrame, agrame-unguarded, agrame-distill, colbert, colbert-distill, gpu-agrame, gpu-agrame128, gpu-agrame128-index, gpu-colbert)" >&2
       exit 2 ;;
  esac
done
$RUN python -m benchmarks.report
