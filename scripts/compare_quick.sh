#!/usr/bin/env bash
# The README's method comparison: each method on the default `quick` MNIST-10k setting
# (Dirichlet delta=0.3, seed 0), one `make run` each, then a table of best/final test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/compare}
declare -A variants=(
  [fedavg]="method='fedavg'"
  [fixmatch]="method='fixmatch'"
  [fixmatch+dpl]="method='fixmatch' dpl=true"
  [fixmatch+dma]="method='fixmatch' dma=true"
  [feddb]="method='feddb'"
)
for name in fedavg fixmatch fixmatch+dpl fixmatch+dma feddb; do
  [ -f "$out/$name/summary.json" ] && continue
  make run RUN_CONFIG="${variants[$name]} seed=0 output-dir='$out/$name'" > "$out.$name.log" 2>&1 \
    || { echo "$name failed, see $out.$name.log"; exit 1; }
done
.venv/bin/python - "$out" <<'PY'
import json, sys, pathlib
print("| variant | best test acc | final test acc |\n|---|---|---|")
for name in ["fedavg", "fixmatch", "fixmatch+dpl", "fixmatch+dma", "feddb"]:
    s = json.loads((pathlib.Path(sys.argv[1]) / name / "summary.json").read_text())
    print(f"| {name} | {100 * s['best_test_accuracy']:.1f} % | {100 * s['final_test_accuracy']:.1f} % |")
PY
