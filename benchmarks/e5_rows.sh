#!/usr/bin/env bash
# Issue 30's rows (benchmarks/README.md, "multilingual-e5-small as backbone and teacher", and e5-kd-128's
# index rows): e5 as users would take it (single vectors), e5 zero-shot as a multi-vector model, the
# shipped e5-kd-128 and its twin (training/e5_kd.sh writes the twin to $AGRAME_RUNS/e5kd/e5-kd-128-psg).
# Resumable (encodings are cached shard by shard). Hours of e5 on 2 CPU cores: the pool's multi-vector
# encoding, its single vectors and its 150k sentences' single vectors are each e5 over ~5M tokens.
# Timings (build-time, latency) pause nothing themselves: run them alone.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
run() { echo "== $*" | tee -a runs/e5_rows.log; "$@" 2>>runs/e5_rows.err | tee -a runs/e5_rows.log; }
TWIN=${AGRAME_RUNS:-runs}/e5kd/e5-kd-128-psg
sample() { [ "$1" = squad-dev ] && echo "--limit 2000 --seed 0"; [ "$1" = entityquestions ] && echo "--limit 1000 --seed 0"; true; }
for d in squad-dev nq-oracle entityquestions; do
  run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg $(sample "$d") --model e5-small --tag e5-small
  run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg $(sample "$d") --model e5-kd-128 --tag e5-kd-128
  # passages first (the pool's single vectors), then sentences too (their single vectors: the long part)
  run python -m benchmarks.open_domain --dataset "$d" --method single-vector $(sample "$d") --baseline-model e5-small \
      --tag e5-small --passages-only
done
for d in squad-dev nq-oracle; do
  [ -d "$TWIN" ] && run python -m benchmarks.open_domain --dataset "$d" --method colbert-zeroshot-psg $(sample "$d") \
      --model "$TWIN" --tag e5-kd-128-psg
  for m in e5-kd-128 e5-small; do  # e5-small: its 384-d token vectors, zero-shot (a ~100 B/token index)
    run python -m benchmarks.index_search run --dataset "$d" --first-stage agrame --nbits 2 \
        $([ "$d" = squad-dev ] && echo --limit 2000) --model "$m" --tag "$m"
  done
done
for m in e5-small e5-kd-128; do
  run python -m benchmarks.cross_domain --dataset scifact --method colbert-zeroshot-psg --model "$m" --tag "$m"
  run python -m benchmarks.atomic_facts --method colbert-zeroshot-psg --model "$m" --tag "$m"
done
run python -m benchmarks.cross_domain --dataset scifact --method single-vector --baseline-model e5-small --tag e5-small
run python -m benchmarks.atomic_facts --method single-vector --baseline-model e5-small --tag e5-small
for d in squad-dev nq-oracle entityquestions; do
  run python -m benchmarks.open_domain --dataset "$d" --method single-vector $(sample "$d") --baseline-model e5-small --tag e5-small
done
for d in squad-dev nq-oracle; do  # full-corpus search (no BM25) with e5 as users would take it, from the same vectors
  run python -m benchmarks.index_search run --dataset "$d" --first-stage single-vector \
      $([ "$d" = squad-dev ] && echo --limit 2000 --seed 0) --baseline-model e5-small --tag e5-small
done
run python -m benchmarks.index_search build --nbits 2 --model e5-kd-128 --tag e5-kd-128
run python -m benchmarks.index_search build-time --models squad-a1 e5-kd-128 --passages 1000   # timing: run alone
for m in "squad-a1" "zero-shot --tag zeroshot" "e5-kd-128 --tag e5-kd-128"; do
  run python -m benchmarks.index_search latency --nbits 2 --model $m   # timing: run alone, one window
done
run python -m benchmarks.report
