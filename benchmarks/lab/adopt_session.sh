#!/usr/bin/env bash
# What the confirming A/B adds to an adoption, live on the H200 (figures in benchmarks/RESULTS.md):
# #3b closed out live (its plan measures BT32 against the seed's BT16), then `kinv adopt 3b V1 --yes --backend cuda`
#   1. against the shipped file (BT32 slower at every level: nothing to adopt, nothing written);
#   2. against a hand-tuned file (BT16, BT64/w8 at batch 1), where BT32 wins above batch 1: written only there,
#      and its samples saved as a replay recording in the same step.
# Runs from a checkout with nothing installed; needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-adopt; rm -rf "$ST"
K="python3 -m kinv.agent.cli"
find kernels/recordings -name "*.jsonl.gz" | sort > /tmp/recordings-before
/usr/bin/time -f "3b wall %e s" $K run plans/3b-tile-shape.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 \
  | grep -v "\] round" | tail -12
/usr/bin/time -f "adopt 1 wall %e s" $K adopt 3b V1 --yes --backend cuda --state-dir "$ST" 2>&1 | tail -25
cat > kernels/configs/mla_decode.json <<'JSON'
{
  "kernel": "mla_decode",
  "description": "Hand-tuned: BT16 with BT64 and 8 warps for a lone request.",
  "BLOCK_T": 16,
  "BLOCK_H": 16,
  "num_warps": 4,
  "num_stages": 2,
  "overrides": [
    {"batch_max": 1, "BLOCK_T": 64, "num_warps": 8}
  ]
}
JSON
/usr/bin/time -f "adopt 2 wall %e s" $K adopt 3b V1 --yes --backend cuda --state-dir "$ST" 2>&1 | tail -30
cat kernels/configs/mla_decode.json
$K experiments 3b --state-dir "$ST" 2>&1 | tail -12
python3 - "$ST/kinv.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for row in c.execute("select e.id, e.kind, e.variant, e.verdict, e.rounds, round(sum(s.gpu_s), 2), round(e.wall_s, 1), "
                     "count(s.id) from experiments e left join samples s on s.experiment = e.id group by e.id"):
    print("experiment", row)
PY
find kernels/recordings -name "*.jsonl.gz" | sort | comm -13 /tmp/recordings-before - | tee /dev/stderr | xargs -r -I{} cp {} "$OUT"/
cp "$ST/kinv.db" "$OUT/kinv-adopt-h200.db"; ls "$ST"/adoptions/ && cp "$ST"/adoptions/* "$OUT"/ 2>/dev/null
