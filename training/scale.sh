#!/usr/bin/env bash
# The scaled recipe of issue 13 (README, Training): every step resumes, so the same command
# continues after an interruption (on this CPU, across sessions).
#   bash training/scale.sh                   # 1,000 steps of ~9 s on 2 CPU cores (~2.5 h a model; README, Scaling up)
#   STEPS=300 bash training/scale.sh         # a shorter run (the data: max(STEPS × 8, 24,000) questions mined)
#   ONLY=agrame bash training/scale.sh       # the candidate only: student, mix, export (then scale_eval.sh agrame)
#   ONLY=data bash training/scale.sh         # the data, mined and labelled, and nothing after
#   GUARDS=2000 MIXES="0.5 0.75 1" ONLY=agrame bash training/scale.sh   # mixed under larger guard sets
#   RUN=echo bash training/scale.sh          # print the stages still to run, run nothing (tests/test_scripts.py)
# DEVICE=cuda puts the students on a GPU (training.student --device; untried: no device has been
# lent to this project yet; checkpoints are device-free, so a run may move between CPU and GPU).
# Stages:
#   start    θ₀ = zero-shot MiniLM itself, its own 384-d token vectors (--dim 0; START/DIM to change), so
#            that the mix's λ = 0 is the model users have today. (The first candidate started from
#            zero-shot-128, the 128-d principal projection: START=zero-shot-128 DIM=128. That start alone
#            cost 3 points of passage P@1 on the NQ guard set, so no mix of it was admissible;
#            training/results/README.md. Its folders were moved to big/first-128.)
#   data     SQuAD v1.1 train, every question (87,599; 5% of articles held out), k = 7 negatives:
#            4 mined by zero-shot-128 (its search of an AGRaME index of the train paragraphs; mined once
#            for the first candidate and kept: any good ranker gives hard negatives), 3 BM25;
#            SciFact train claims (rationale sentences), 20% held out; gold labels as the teacher
#   student  L_psg (in-batch negatives) + L_sent, [Q'] sentence queries, all six layers with
#            learning rate × 0.8 per layer down, warm-up 5% then linear decay, from θ₀
#   mix      WiSE-FT λ between θ₀ and the student, then α, chosen on the held-out SQuAD articles
#            and SciFact claims among the mixes no more than 1 point below zero-shot on two guard
#            sets outside the training mix (DPR NQ / TriviaQA dev questions; training.choose_mix
#            --guard) — never on a reported split. (The first candidate, `export/default`, was mixed
#            without guards: λ = 1, and it lost out of domain; training/results/README.md.)
#   export   the interpolated model as a delta (training.export)
#   baseline the same with the passage loss only (--sentence-weight 0), the paper's comparison, mixed alike
set -euo pipefail
cd "$(dirname "$0")/.."
R=${AGRAME_RUNS:-runs}/big
# 1,000 by default: what two CPU sessions can train per model here (the baseline needs as many);
# on a device give STEPS=5000 or more.
STEPS=${STEPS:-1000}
START=${START:-zero-shot}   # θ₀: a model name or folder (see above)
DIM=${DIM:-0}              # the student's projection: 0 = none (START must then have none either)
# SQuAD questions mined: what the run consumes (STEPS × 8), and at least 24,000 — the pool both earlier
# candidates drew their 8,000 from (mined when STEPS defaulted to 3,000). The pool's size sets the mixture's
# shares (SciFact ×4 ~5% and DISTILL ~19% of a batch beside 24,000; ~10% and ~38% beside 8,000).
MINED_LIMIT=${MINED_LIMIT:-$((STEPS * 8 > 24000 ? STEPS * 8 : 24000))}
# DISTILL=1: also zero-shot MiniLM's own scores on 2,000 + 2,000 DPR NQ / TriviaQA dev questions that
# are not the guard sets', and on 2,000 statements (sentences of the Wikipedia leads, as atomic facts and
# citation query; training.mined distill + training.teachers multivector): self-distillation against
# forgetting. M: where students, mixes and exports go (the data stay in R), e.g.
#   DISTILL=1 M=runs/big/distill bash training/scale.sh
DISTILL=${DISTILL:-0}
# Copies of each distill file in the mix: 1 puts ~1.5 of every batch's 8 questions on them (6,000 records
# beside 23,997 SQuAD and 4 × 404 SciFact; 2: ~2.5, at the cost of SQuAD questions). A choice made before
# measuring; the mix measures its effect on the guard sets.
DISTILL_COPIES=${DISTILL_COPIES:-1}
M=${M:-$R}
# GUARDS=N: guard sets of N questions each instead of 500 for the mix (500 answer-matched questions carry a
# standard error of ~2 points against its 1-point tolerance); their mixes, models and exports are named
# guarded<N> (e.g. export/guarded2000), beside the 500-question ones. MIXES="0.5 0.75 1": only those λ
# (a row costs minutes per 1,000 questions).
. training/guards.sh
MIXES=${MIXES:-}
RUN=${RUN:-}
$RUN mkdir -p "$R" "$M"
# MINED=0: the SQuAD negatives all BM25's, no index of the train paragraphs (how the GPU students of
# ../shared/models were trained: the CPU index search did not fit that run's time).
# RANKING=FILE: the model's side of the mined negatives from a ranking made elsewhere (the GPU's exact scan:
# training.bundle run --mine-only, then unpack), instead of the CPU index search.
MINED=${MINED:-4}
RANKING=${RANKING:-}
if [ "$MINED" = 0 ]; then mine=(--mined 0 --mine-model none)
elif [ -n "$RANKING" ]; then mine=(--mined "$MINED" --ranking "$RANKING")
else mine=(--mined "$MINED" --mine-model zero-shot-128 --index "$R/train-index"); fi
[ -s "$R/squad.jsonl" ] || $RUN python -m training.mined squad --out "$R/squad.jsonl" --heldout "$R/squad-heldout.jsonl" \
    --negatives 7 "${mine[@]}" --limit "$MINED_LIMIT"
[ -s "$R/scifact.jsonl" ] || $RUN python -m training.mined scifact --out "$R/scifact.jsonl" --heldout "$R/scifact-heldout.jsonl" \
    --negatives 7
for part in squad scifact; do
  [ -s "$R/$part-labels.jsonl" ] || $RUN python -m training.teachers labels --data "$R/$part.jsonl" --out "$R/$part-labels.jsonl"
done
# QUERY_MARKER=none (since the distill candidate): passage queries unmarked, as zero-shot encodes them, so
# that the mix's λ = 0 ranks passages exactly as zero-shot; with [Q] (QUERY_MARKER=Q, how big-agrame-guarded
# was trained) the untrained marker alone cost 2 points of NQ-guard passage P@1 at λ = 0
# (training/results/README.md). Sentence queries keep [Q'].
QUERY_MARKER=${QUERY_MARKER:-none}
recipe=(--init-model "$START" --layers 6 --dim "$DIM" --query-marker "$QUERY_MARKER"
        --steps "$STEPS" --batch-size 8 --lr 1e-4 --warmup 0.05 --layer-lr-decay 0.8 --in-batch --seed 0
        --device "${DEVICE:-cpu}" --data "$R/squad-labels.jsonl" "$R/scifact-labels.jsonl@4")
# Guard sets: DPR NQ / TriviaQA development questions, outside the training mix (training.mined guard)
for topics in nq-dev trivia-dev; do
  [ -s "$R/guard-$topics.jsonl" ] || $RUN python -m training.mined guard --topics "$topics" --out "$R/guard-$topics.jsonl"
done
distill_questions() {  # distill_questions TOPICS: the distill run's unlabelled questions, without the guard sets'
  local -a exclude=()  # (statements are no guard set's questions)
  [ "$1" = wiki-claims ] || exclude=(--exclude "$R/guard-$1.jsonl")
  [ -s "$R/distill-$1.jsonl" ] || $RUN python -m training.mined distill --topics "$1" \
      "${exclude[@]}" --limit 2000 --out "$R/distill-$1.jsonl"
}
if [ "$DISTILL" = 1 ]; then
  for topics in nq-dev trivia-dev wiki-claims; do
    distill_questions "$topics"
    [ -s "$R/distill-$topics-scored.jsonl" ] || $RUN python -m training.teachers multivector --model zero-shot \
        --data "$R/distill-$topics.jsonl" --out "$R/distill-$topics-scored.jsonl"
    recipe+=("$R/distill-$topics-scored.jsonl@$DISTILL_COPIES")  # (--data is the array's last option)
  done
fi
# GUARDS (above): larger guard sets leave out the distill questions (made here whether or not DISTILL=1, so
# that the sets do not depend on it); taken in the same shuffled order, they begin with the 500.
if [ "$GUARDS" != 500 ]; then
  for topics in nq-dev trivia-dev; do
    distill_questions "$topics"
    [ -s "$R/$guards-$topics.jsonl" ] || $RUN python -m training.mined guard --topics "$topics" --limit "$GUARDS" \
        --exclude "$R/distill-$topics.jsonl" --out "$R/$guards-$topics.jsonl"
  done
fi
if [ "${ONLY:-}" = data ]; then  # ONLY=data: the data only (e.g. mined while the recipe is still being changed)
  exit 0
fi
. training/mix.sh  # mix NAME TUNED START: WiSE-FT λ then α under the guard sets (the one definition)
# The candidate is mixed and exported before the baseline trains: on the CPU that is a session
# earlier to see whether it can beat zero-shot at all.
[ -e "$M/agrame/final/agrame.json" ] || $RUN python -m training.student "${recipe[@]}" --out "$M/agrame" --sentence-marker "Q'"
# (if-blocks, not `||`: bash ignores set -e inside a function called on the left of && or ||)
if [ ! -e "$M/export/$G/delta.json" ]; then
  mix agrame "$M/agrame/final" "$START"
  $RUN python -m training.export --model "$M/agrame-$G" --out "$M/export/$G"
fi
if [ "${ONLY:-}" = agrame ]; then  # ONLY=agrame: stop at the candidate (measure it before the baseline trains)
  exit 0
fi
[ -e "$M/colbert/final/agrame.json" ] || $RUN python -m training.student "${recipe[@]}" --out "$M/colbert" --sentence-weight 0
mix colbert "$M/colbert/final" "$START"  # cheap (minutes); repeated on a rerun like the stages before it
