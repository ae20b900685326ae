#!/usr/bin/env bash
# The training pipeline on a CPU from ../shared/data. Every step resumes: a finished
# step's output is kept, an interrupted training continues from its checkpoint.
#   bash training/reproduce.sh            # runs/ holds data, teachers, students and logs
#   SHIP=1 bash training/reproduce.sh     # also export the student as the package default
# Nothing has been shipped yet: no student trained this way beat the zero-shot default
# (see the issue notes), so export is opt-in.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${AGRAME_RUNS:-runs}
T="$R/teachers"
mkdir -p "$R/train"
[ -s "$R/train/squad-train.jsonl" ] || python -m training.data --out "$R/train/squad-train.jsonl" --questions 4000 --negatives 3
# Teacher: one-pass CE (passage at [CLS], sentences at their markers), then two stages
# with the listwise sentence loss (BCE alone left the sentence head near chance).
[ -e "$T/one-pass/final/teacher.json" ] || python -m training.teachers train --kind one-pass \
    --data "$R/train/squad-train.jsonl" --out "$T/one-pass" --steps 400 --batch-size 4 --lr 1e-4
[ -e "$T/one-pass-listwise/final/teacher.json" ] || python -m training.teachers train --kind one-pass \
    --init "$T/one-pass/final" --listwise-sentences --data "$R/train/squad-train.jsonl" \
    --out "$T/one-pass-listwise" --steps 200 --batch-size 4 --lr 5e-5 --seed 1
[ -e "$T/one-pass-listwise2/final/teacher.json" ] || python -m training.teachers train --kind one-pass \
    --init "$T/one-pass-listwise/final" --listwise-sentences --data "$R/train/squad-train.jsonl" \
    --out "$T/one-pass-listwise2" --steps 400 --batch-size 4 --lr 5e-5 --seed 2
python -m training.teachers evaluate --model "$T/one-pass-listwise2/final" --limit 300 --depth 10
python -m training.teachers evaluate --student --limit 300 --depth 10
[ -s "$R/train/distill.jsonl" ] || python -m training.teachers score --model "$T/one-pass-listwise2/final" \
    --data "$R/train/squad-train.jsonl" --out "$R/train/distill.jsonl" --limit ${DISTILL_QUESTIONS:-2400}
[ -e "$R/students/agrame/final/agrame.json" ] || python -m training.student --data "$R/train/distill.jsonl" \
    --out "$R/students/agrame" --sentence-marker "Q'" --weighting softmax --layers 2 --dim 128 \
    --steps ${STUDENT_STEPS:-250} --batch-size 8 --lr 2e-4
python -m training.choose_alpha --model "$R/students/agrame/final" --data "$R/train/squad-train.jsonl" \
    --skip ${DISTILL_QUESTIONS:-2400} --limit 300 --write
if [ "${SHIP:-0}" = 1 ]; then
    python -m training.export --model "$R/students/agrame/final" --out agrame/models/default
else
    echo "student in $R/students/agrame/final; benchmark it (benchmarks.open_domain --model …) before SHIP=1"
fi
