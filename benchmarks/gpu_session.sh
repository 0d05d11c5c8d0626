#!/usr/bin/env bash
# Everything kinv measures live on the H200, in one call (figures in benchmarks/RESULTS.md).
# Needs the wheels of pydantic, sqlite-utils, langgraph (carried in .whl/) on the GPU image.
# RECORD=1 also re-records the #3a space for the replay backend.
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-state; rm -rf "$ST"
[ -n "$RECORD" ] && python3 benchmarks/record_3a.py --rounds 30 --out "$OUT/mla_decode-3a.jsonl.gz" 2>&1 | tail -3
[ -n "$RECORD" ] && cp "$OUT/mla_decode-3a.jsonl.gz" kernels/recordings/h200/mla_decode-3a.jsonl.gz
/usr/bin/time -f "wall %e s" python3 -m agent.cli run plans/3a-attention-occupancy.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "round " | tail -14
/usr/bin/time -f "wall %e s" python3 -m agent.cli run plans/6a-fault-drill.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "round " | tail -22
python3 -m agent.cli bench --variant BLOCK_T=32 --backend cuda --contexts 4096 --shapes v4flash --state-dir "$ST" 2>&1 | tail -3
python3 -m agent.cli experiments 6a --state-dir "$ST"
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-h200.db"
git status --short kernels plans
