#!/usr/bin/env bash
# The shipping rule's protocol (issue 51): every full-protocol row for a candidate and for zero-shot
# MiniLM, each run writing its per-question outcomes (the paired test of `benchmarks.report`'s verdict
# reads them). Tags ship-<model>. Resumable: a row whose result file exists is skipped.
#   bash benchmarks/shipping.sh zero-shot gpu2100-agrame128    # the models, by shipped name or folder
#   RUN=echo bash benchmarks/shipping.sh gpu2100-agrame128     # print the commands only
# Order: the small rows first (where the paired test decides), then the open-domain sets (each model
# encodes the 33.6k-passage pool once, cached under $AGRAME_CACHE), citation last (the slowest).
# On 2 CPU cores, one thread each: ~25 min of rows and ~1 h of citation per model.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-}
res=${RESULTS:-benchmarks/results}
[ $# -gt 0 ] || { echo "usage: bash benchmarks/shipping.sh MODEL [MODEL ...]" >&2; exit 2; }
for model in "$@"; do
  tag="ship-$(basename "$model")"
  [ -s "$res/evidence-wice-dev-$tag.json" ] ||
    $RUN python -m benchmarks.evidence --model "$model" --tag "$tag"
  [ -s "$res/cross_domain-scifact-dev-colbert-zeroshot-psg-$tag.json" ] ||
    $RUN python -m benchmarks.cross_domain --dataset scifact --method colbert-zeroshot-psg --model "$model" --tag "$tag"
  [ -s "$res/atomic_facts-colbert-zeroshot-psg-$tag.json" ] ||
    $RUN python -m benchmarks.atomic_facts --method colbert-zeroshot-psg --model "$model" --tag "$tag"
  for spec in "entityquestions --limit 1000 --seed 0" "squad-dev --limit 2000 --seed 0" "nq-oracle"; do
    set -- $spec
    [ -s "$res/open_domain-$1-colbert-zeroshot-psg-$tag.json" ] ||
      $RUN python -m benchmarks.open_domain --dataset $spec --method colbert-zeroshot-psg --model "$model" --tag "$tag"
  done
  # rand_val first: it chooses the margin that the other two use (read by tag)
  for split in rand_val domain_val wice; do
    if [ "$split" = wice ]; then dataset=(wice); name=wice-dev; else dataset=(expertqa --split "$split"); name=expertqa-$split; fi
    [ -s "$res/citation-$name-$tag.json" ] ||
      $RUN python -m benchmarks.citation --dataset "${dataset[@]}" --model "$model" --tag "$tag" --no-single-vector
  done
done
