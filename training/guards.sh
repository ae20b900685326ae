# Sourced by training/scale.sh and training/scale_eval.sh: the one place that names the guard sets a mix is
# chosen under. GUARDS=N (default 500) questions each; 500 keeps the first sets' names.
#   guards  the guard files' stem ($R/$guards-nq-dev.jsonl)   G    the mixes', models' and exports' suffix
#   sfx     the benchmark tags' suffix
GUARDS=${GUARDS:-500}
case $GUARDS in
  ''|*[!0-9]*|0) echo "$(basename "$0"): GUARDS must be a positive number of questions, not '$GUARDS'" >&2; exit 2 ;;
  500) guards=guard G=guarded sfx= ;;
  *) guards=guard$GUARDS G=guarded$GUARDS sfx=-g$GUARDS ;;
esac
