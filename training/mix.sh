# Sourced by training/scale.sh and training/gpu_students.sh: the one definition of how a student is mixed.
# Needs R (the data), M (where mixes and models go), G / guards (training/guards.sh), MIXES and RUN.
mix() {  # mix NAME TUNED START: WiSE-FT λ and then α, chosen on held-out train data, no more than 1 point below zero-shot
  local m=$1 tuned=$2 start=$3
  local out="$M/choose-mix-$m-$G.json"  # (a second `local`: the first's $m is not set while it expands)
  # zero-shot's row is the same for every model mixed on these sets: taken from any earlier mix that has it
  local -a reuse=() mixes=()
  local f
  for f in "$R"/choose-mix-*-$G.json "$R"/*/choose-mix-*-$G.json; do
    if [ -s "$f" ] && [ "$f" != "$out" ]; then reuse+=(--reuse "$f"); fi
  done
  [ -z "$MIXES" ] || read -r -a mixes <<< "--mix $MIXES"
  [ -s "$out" ] || $RUN python -m training.choose_mix --start "$start" --tuned "$tuned" \
      --held "squad=$R/squad-heldout.jsonl:0:500" --held "scifact=$R/scifact-heldout.jsonl" \
      --guard "nq=$R/$guards-nq-dev.jsonl" --guard "trivia=$R/$guards-trivia-dev.jsonl" ${mixes[@]+"${mixes[@]}"} \
      --reference zero-shot ${reuse[@]+"${reuse[@]}"} --out "$out"
  local lam="<λ chosen in $out>"
  [ -n "$RUN" ] || lam=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['best']['model'].split('=')[1])" "$out")
  $RUN python -m training.interpolate --start "$start" --tuned "$tuned" --mix "$lam" --out "$M/$m-$G"
  $RUN python -m training.choose_alpha --model "$M/$m-$G" --data "$R/squad-heldout.jsonl" --skip 0 --limit 500 --write
}
