#!/usr/bin/env bash
# Everything kinv measures live on the H200, in one call (figures in benchmarks/RESULTS.md).
# Needs the wheels of pydantic, sqlite-utils, langgraph and their needs (carried in .whl/) on the GPU image.
# RECORD=1 also re-records the replay samples (benchmarks/record.py); PLACEMENT=1 re-runs the 6-worker test.
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-state; rm -rf "$ST"
[ -n "$PLACEMENT" ] && python3 benchmarks/placement_offset.py --workers 6 --rounds 12 --out "$OUT/placement_h200.json"
[ -n "$RECORD" ] && python3 benchmarks/record.py --rounds 32 --aa-rounds 16 --aa-arms 4 --out "$OUT/mla_decode-v4flash.jsonl.gz" 2>&1 | tail -2
for plan in 3a-attention-occupancy 3c-null-batch-aware 6a-fault-drill; do
  /usr/bin/time -f "wall %e s" python3 -m agent.cli run plans/$plan.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -16
done
python3 -m agent.cli experiments 3a --state-dir "$ST"; python3 -m agent.cli experiments 3c --state-dir "$ST"
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-h200.db"
git status --short kernels plans
