#!/usr/bin/env bash
# Reproduce every baseline table in benchmarks/README.md (zero-shot MiniLM: `--model zero-shot`,
# since the package default is now the trained model). Resumable: encodings
# are cached under $AGRAME_CACHE (default cache/), so a rerun skips finished shards.
# About 2 hours on 2 CPU cores, most of it encoding the 33.6k-passage pool and its 150k sentences.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
run() { echo "== $*" | tee -a runs/run_all.log; "$@" 2>>runs/run_all.err | tee -a runs/run_all.log; }
Z=(--model zero-shot)

if [ "${1:-}" != "--skip-atomic" ]; then
  for m in bm25 single-vector colbert-zeroshot-psg colbert-zeroshot-sent subencoder-zeroshot subencoder; do
    run python -m benchmarks.atomic_facts --method "$m" "${Z[@]}"
  done
fi
run python -m benchmarks.encodings "${Z[@]}"
for m in bm25 single-vector colbert-zeroshot-psg colbert-zeroshot-sent; do
  run python -m benchmarks.cross_domain --dataset scifact --method "$m" "${Z[@]}"
  run python -m benchmarks.open_domain --dataset squad-dev --method "$m" --limit 2000 --seed 0 "${Z[@]}"
  run python -m benchmarks.open_domain --dataset nq-oracle --method "$m" "${Z[@]}"
done
for d in nq-open entityquestions; do
  for m in bm25 single-vector colbert-zeroshot-psg colbert-zeroshot-sent; do
    run python -m benchmarks.open_domain --dataset "$d" --method "$m" --limit 1000 --seed 0 "${Z[@]}"
  done
done
run python -m benchmarks.segmentation --split test
run python -m benchmarks.segmentation --split dev
run python -m benchmarks.citation --dataset expertqa --split rand_val "${Z[@]}"   # chooses margin and λ
run python -m benchmarks.citation --dataset expertqa --split domain_val "${Z[@]}"
run python -m benchmarks.citation --dataset wice "${Z[@]}"
# The quick protocol (500 questions, BM25 top-20) that trained models are compared on;
# the trained-model rows come from training/compare.sh, the Teachers table from training/teachers.sh.
for d in squad-dev nq-oracle; do
  run python -m benchmarks.open_domain --dataset "$d" --method bm25 --limit 500 --depth 20 --tag s500
  for m in colbert-zeroshot-psg colbert-zeroshot-sent; do
    run python -m benchmarks.open_domain --dataset "$d" --method "$m" --limit 500 --depth 20 --tag zeroshot "${Z[@]}"
  done
done
run python -m benchmarks.speed
run python -m benchmarks.citation --dataset latency                     # timing: run alone
# Which model is the default (issue 13): the full protocol for zero-shot and squad-a1, and the
# quick-protocol rows of zero-shot-128 (squad-a1's come from training/compare.sh).
for d in nq-oracle squad-dev; do
  run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg --model zero-shot \
      --tag zeroshot-full $([ "$d" = squad-dev ] && echo --limit 2000)
done
for d in squad-dev nq-oracle entityquestions; do
  run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg --limit 500 --depth 20 \
      --model zero-shot-128 --tag zeroshot-128
done
run python -m benchmarks.cross_domain --method colbert-zeroshot-psg --model zero-shot-128 --tag zeroshot-128
run python -m benchmarks.atomic_facts --method colbert-zeroshot-psg --model zero-shot-128 --tag zeroshot-128
# The compressed index over the whole pool (issue 12), measured with squad-a1 (the default then;
# ~1.5 h in all), and the default's (zero-shot, 384-d) size and latency.
A1=(--model squad-a1)
run python -m benchmarks.index_search build --nbits 2 4 "${A1[@]}"
run python -m benchmarks.index_search choose --nbits 2 --limit 100 "${A1[@]}"   # sets the search defaults
for d in nq-oracle squad-dev; do
  run python -m benchmarks.index_search run --dataset "$d" --first-stage exact --limit 300 "${A1[@]}"
  run python -m benchmarks.index_search run --dataset "$d" --first-stage agrame --nbits 2 "${A1[@]}"
  for b in 4 8; do
    run python -m benchmarks.index_search run --dataset "$d" --first-stage agrame --nbits "$b" --limit 300 "${A1[@]}"
  done
  run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg --tag shipped "${A1[@]}" \
      $([ "$d" = squad-dev ] && echo --limit 2000)
done
run python -m benchmarks.index_search run --dataset squad-dev --first-stage agrame --nbits 2 --limit 2000 "${A1[@]}"
run python -m benchmarks.index_search latency --nbits 2 "${A1[@]}"   # timing: run alone
run python -m benchmarks.index_search build --nbits 2 --model zero-shot --tag zeroshot
run python -m benchmarks.index_search latency --nbits 2 --model zero-shot --tag zeroshot   # timing: run alone
# colbert-ai's PLAID beside it (extra colbert; timing: run alone).
run python -m benchmarks.plaid --model squad-a1 --dataset nq-oracle --threads 2
run python -m benchmarks.serve_load --clients 8 --requests 100        # timing: run alone
run python -m benchmarks.index_search scale --tokens 1e7
run python -m benchmarks.index_search scale --tokens 1e8    # ~2 h on 2 cores, alone; k-means kept on disk
run python -m benchmarks.report
