#!/usr/bin/env bash
# A training bundle's entry point on the GPU machine (python -m training.bundle pack copies it in as run.sh):
#   bash .bundle/run.sh --out "$OUT" [--device cuda] [--budget 540] [--steps N] [--models agrame128] [--batch-size 64]
# installs the bundle's wheels (transformers < 4.58, tokenizers) into a folder first on PYTHONPATH, then runs
# python -m training.bundle run from the bundle's own code. PYTHON picks the interpreter (default python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py=${PYTHON:-python3}
site=${SITE:-${TMPDIR:-/tmp}/agrame-bundle-site}
if compgen -G "$here/wheels/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$here"/wheels/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$here/code${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$py" -m training.bundle run --bundle "$here" "$@"
