#!/usr/bin/env bash
# The evidence behind live verdicts, on the H200, in two calls (figures in benchmarks/RESULTS.md):
#   PHASE=record  compiled resources of every recorded config and the 3a profiles for replay
#                 (benchmarks/record_compiled.py), and the wide gate at 4096 and 16384
#   PHASE=live    3a with its profile step and the fault drill, live, and `kinv pending` of a 3a paused at
#                 V1's approval (the variant compiled before a person approves)
# Needs the wheels of pydantic, sqlite-utils, langgraph and their needs in .whl/ (benchmarks/gpu_session.sh).
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
kinv() { python3 -m kinv.agent.cli "$@"; }
if [ "$PHASE" = record ]; then
  /usr/bin/time -f "record_compiled wall %e s" python3 benchmarks/record_compiled.py --out "$OUT/rec" \
    --profile plans/3a-attention-occupancy.yaml@b64 2>&1 | tail -30
  for ctx in 4096 16384; do
    python3 benchmarks/mla_gate.py --context $ctx --out "$OUT/gate-$ctx.json" 2>&1 | tail -4
  done
fi
if [ "$PHASE" = live ]; then
  ST=/tmp/kinv-live; rm -rf "$ST"
  for plan in 3a-attention-occupancy 6a-fault-drill; do
    /usr/bin/time -f "$plan wall %e s" python3 -m kinv.agent.cli run plans/$plan.yaml --backend cuda --approval auto \
      --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -24
  done
  for i in $(seq 1 12); do kinv show $i --state-dir "$ST"; done > "$OUT/show-live.txt" 2>&1
  cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-h200.db"
  kinv report 3a --json --state-dir "$ST" > "$OUT/3a-report.json" 2>/dev/null
  kinv report 6a --json --state-dir "$ST" > "$OUT/6a-report.json" 2>/dev/null
  git status --short kernels plans
  ST=/tmp/kinv-ask; rm -rf "$ST"
  /usr/bin/time -f "ask wall %e s" python3 -m kinv.agent.cli run plans/3a-attention-occupancy.yaml --backend cuda --approval ask \
    --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -6
  kinv pending --state-dir "$ST" 2>&1 | tee "$OUT/pending.txt" | head -60
  kinv experiments 3a --state-dir "$ST" > "$OUT/experiments-ask.txt" 2>&1
fi
