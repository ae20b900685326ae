#!/usr/bin/env bash
# Reproduce the shipped default model on a CPU from ../shared/data (every step resumes:
# a finished step's output is kept, an interrupted training continues from its checkpoint).
#   bash training/reproduce.sh            # runs/ holds data, teachers, students and logs
set -euo pipefail
cd "$(dirname "$0")/.."
R=${AGRAME_RUNS:-runs}
mkdir -p "$R/train"
[ -s "$R/train/squad-train.jsonl" ] || python -m training.data --out "$R/train/squad-train.jsonl" --questions 4000 --negatives 3
[ -e "$R/teachers/one-pass/final/teacher.json" ] || python -m training.teachers train --kind one-pass \
    --data "$R/train/squad-train.jsonl" --out "$R/teachers/one-pass" --steps 400 --batch-size 4 --lr 1e-4
[ -s "$R/train/distill.jsonl" ] || python -m training.teachers score --model "$R/teachers/one-pass/final" \
    --data "$R/train/squad-train.jsonl" --out "$R/train/distill.jsonl" --limit ${DISTILL_QUESTIONS:-2400}
[ -e "$R/students/agrame/final/agrame.json" ] || python -m training.student --data "$R/train/distill.jsonl" \
    --out "$R/students/agrame" --sentence-marker "Q'" --weighting softmax --layers 2 --dim 128 \
    --steps ${STUDENT_STEPS:-300} --batch-size 8
python -m training.export --model "$R/students/agrame/final" --out agrame/models/default
