#!/usr/bin/env bash
# Issue 60: agrame train on SciFact's train claims (rationale sentences as spans), from the default, on 2 CPU
# cores, beside the same run with the passage loss alone; SciFact dev and the NQ guard for both. Every stage
# resumes (a finished file is skipped). The NQ guard file: GUARDS=2000 ONLY=data bash training/scale.sh.
#   bash benchmarks/train_scifact.sh          # then training/results/$NAME.json
#   RUN=echo bash benchmarks/train_scifact.sh # print the stages, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${NAME:-train-scifact-r2}  # the run's folder, result tags and report (train-scifact: the first run, issue 60's
                                # note; r2: attention dropout off, agrame train's default since)
W=${AGRAME_RUNS:-runs}/$NAME
G=${AGRAME_RUNS:-runs}/big/guard2000-nq-dev.jsonl
STEPS=${STEPS:-100}   # 800 question-steps: two passes over the 80 % of the ~500 pairs that train
RUN=${RUN:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
[ -s "$W/pairs.jsonl" ] || $RUN python -m benchmarks.train_scifact data --out "$W"
for kind in agrame passage; do
  loss=(); [ "$kind" = passage ] && loss=(--sentence-loss off)
  [ -e "$W/$kind/train.json" ] || $RUN agrame train --pairs "$W/pairs.jsonl" --corpus "$W/corpus.jsonl" \
      --out "$W/$kind" --steps "$STEPS" "${loss[@]}"
  [ -s "benchmarks/results/cross_domain-scifact-dev-colbert-zeroshot-psg-$NAME-$kind.json" ] || \
    $RUN python -m benchmarks.cross_domain --dataset scifact --method colbert-zeroshot-psg --model "$W/$kind" \
      --tag "$NAME-$kind"
  [ -s "$W/$kind-guard.json" ] || $RUN python -m benchmarks.train_scifact guard --model "$W/$kind" --guard "$G" \
      --out "$W/$kind-guard.json"
done
$RUN python -m benchmarks.train_scifact report --runs "$W" --name "$NAME"
