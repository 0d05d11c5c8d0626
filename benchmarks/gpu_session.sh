#!/usr/bin/env bash
# Everything kinv measures live on the H200, in one call (see README "GPU figures").
# Needs the wheels of pydantic, sqlite-utils, langgraph (carried in .whl/) on the GPU image.
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-state; rm -rf "$ST"
[ -n "$RECORD" ] && python3 benchmarks/record_3a.py --rounds 30 --out "$OUT/mla_decode-3a.jsonl.gz" 2>&1 | tail -3
/usr/bin/time -v python3 -m agent.cli run plans/3a-attention-occupancy.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "round " | tail -25
python3 -m agent.cli run plans/3b-tile-shape.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "round " | tail -12
python3 -m agent.cli bench --variant BLOCK_T=32 --backend cuda --contexts 4096 --shapes v4flash --state-dir "$ST" --json > "$OUT/ab_bt32.json" 2>&1; tail -5 "$OUT/ab_bt32.json"
python3 -m agent.cli bench --backend cuda --state-dir "$ST" 2>&1 | tail -22
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-h200.db"
git diff --stat kernels/configs
