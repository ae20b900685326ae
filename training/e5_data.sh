# The data stage of issue 30's e5 recipes (sourced by training/e5_kd.sh and training/e5_student.sh;
# needs R and RUN): SQuAD v1.1 train questions (5% of articles held out) with the gold paragraph and
# 7 BM25 negatives from the train paragraphs; guard sets of DPR NQ / TriviaQA development questions;
# DPR NQ development questions outside the guard sets with BM25's top 8 (unlabelled: e5 teaches them).
[ -s "$R/squad.jsonl" ] || $RUN python -m training.mined squad --out "$R/squad.jsonl" --heldout "$R/squad-heldout.jsonl" \
    --negatives 7 --mined 0 --mine-model none --limit 2000 --heldout-questions 300
for topics in nq-dev trivia-dev; do
  [ -s "$R/guard-$topics.jsonl" ] || $RUN python -m training.mined guard --topics "$topics" --out "$R/guard-$topics.jsonl"
done
[ -s "$R/distill-nq-dev.jsonl" ] || $RUN python -m training.mined distill --topics nq-dev --out "$R/distill-nq-dev.jsonl" \
    --limit 500 --exclude "$R/guard-nq-dev.jsonl" --exclude "$R/guard-trivia-dev.jsonl"
