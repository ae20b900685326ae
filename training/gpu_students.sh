#!/usr/bin/env bash
# Issue 39: mix and measure the GPU-trained students (../shared/models/README.md) exactly as the CPU candidates
# were. Every stage resumes (a finished file is skipped), so the same command goes on after an interruption.
#   bash training/gpu_students.sh                 # data, then every student mixed under the 500-question guards
#   GUARDS=2000 bash training/gpu_students.sh     # the same under the 2,000-question guard sets
#   ONLY="agrame128" bash training/gpu_students.sh   # some students only (agrame, colbert, agrame128)
#   PREFIX=gpu400b64 ONLY=agrame128 GUARDS=2000 MIXES="0.5 0.75 1" bash training/gpu_students.sh
#                                                  # another call's student (../shared/models/gpu400b64-agrame128)
#   RUN=echo bash training/gpu_students.sh        # print the stages, run nothing (tests/test_scripts.py)
# then the full protocol: bash training/scale_eval.sh gpu-agrame gpu-colbert gpu-agrame128
# Stages:
#   data    the students' own data commands (training/scale.sh with MINED=0: SQuAD negatives all BM25's) — only
#           the held-out SQuAD articles, held-out SciFact claims and guard sets are used here
#   mix     WiSE-FT λ between each student's θ₀ (zero-shot for the 384-d ones, zero-shot-128 for the 128-d one)
#           and the student, then α, on held-out train data under the guard sets (training/mix.sh, as scale.sh)
#   export  the mixed model as a delta (training.export): $M/export/NAME-$G
set -euo pipefail
cd "$(dirname "$0")/.."
R=${AGRAME_RUNS:-runs}/big
S=${STUDENTS:-../shared/models}    # where the students' folders are
PREFIX=${PREFIX:-gpu2100}          # the students' folder names: PREFIX-agrame, PREFIX-agrame128, …
M=${M:-$R/gpu}
. training/guards.sh
MIXES=${MIXES:-}
RUN=${RUN:-}
$RUN mkdir -p "$M"
# The data: MINED=0 as the students were trained; DISTILL=0: the distill records are not needed to mix
# (with GUARDS=2000 their questions are still made, to be left out of the larger guard sets).
MINED=0 DISTILL=0 ONLY=data GUARDS="$GUARDS" M="$R" bash training/scale.sh
. training/mix.sh
for what in ${ONLY:-agrame agrame128 colbert}; do
  case $what in
    agrame|colbert) start=zero-shot ;;
    agrame128) start=zero-shot-128 ;;
    *) echo "gpu_students: unknown student '$what' (agrame, colbert, agrame128)" >&2; exit 2 ;;
  esac
  name=$PREFIX-$what
  [ -n "$RUN" ] || [ -e "$S/$name/agrame.json" ] || { echo "gpu_students: $S/$name not found (STUDENTS=folder)" >&2; exit 2; }
  mix "$name" "$S/$name" "$start"
  [ -e "$M/export/$name-$G/delta.json" ] || $RUN python -m training.export --model "$M/$name-$G" --out "$M/export/$name-$G"
done
