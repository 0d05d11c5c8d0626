#!/usr/bin/env bash
# Everything kinv measures live on the H200, in one call (figures in benchmarks/RESULTS.md).
# Runs from a source checkout with nothing installed (kinv/__init__.py maps kinv.agent and kinv.kernels onto
# agent/ and kernels/). Needs the wheels of pydantic, sqlite-utils, langgraph and their needs (carried in .whl/).
#   RECORD="mla moe"  re-records the replay samples of those kernels into $OUT (benchmarks/record.py)
#   PLACEMENT=1  re-runs the 6-worker placement test
#   SWEEP=1  records the whole space of plans/7-decode-ceiling.yaml (the campaign's replay and its truth)
#   PLANS="..."  the plans run live (default: 3a, 3c, 6a, 6b; PLANS=none runs none)
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-state; rm -rf "$ST"
[ -n "$PLACEMENT" ] && python3 benchmarks/placement_offset.py --workers 6 --rounds 12 --out "$OUT/placement_h200.json"
if [[ " $RECORD " == *" mla "* ]]; then
  python3 benchmarks/record.py --plan plans/3a-attention-occupancy.yaml --plan plans/3b-tile-shape.yaml \
    --plan plans/3c-null-batch-aware.yaml --rounds 32 --aa-rounds 16 --aa-arms 4 \
    --out "$OUT/mla_decode-v4flash.jsonl.gz" 2>&1 | tail -2
fi
if [[ " $RECORD " == *" moe "* ]]; then
  # the expert GEMM's weights are 9.4 GB per worker: A/A and A/B in two passes (at most 6 workers resident)
  python3 benchmarks/record.py --plan plans/4a-expert-gemm-tiles.yaml --rounds 0 --aa-rounds 16 --aa-arms 4 \
    --out "$OUT/moe_expert_gemm-aa.jsonl.gz" 2>&1 | tail -2
  python3 benchmarks/record.py --plan plans/4a-expert-gemm-tiles.yaml --rounds 24 --aa-rounds 16 --aa-arms 0 \
    --out "$OUT/moe_expert_gemm-ab.jsonl.gz" 2>&1 | tail -2
fi
if [ -n "$SWEEP" ]; then
  python3 benchmarks/record.py --sweep plans/7-decode-ceiling.yaml --rounds "${SWEEP_ROUNDS:-24}" --replicas 2 \
    --jobs 12 --out "$OUT/mla_decode-v4flash-sweep.jsonl.gz" 2>&1 | grep -v "^# round"
fi
if [ -n "$CAMPAIGN" ]; then
  # campaign #7, live; cut at ${CAMPAIGN_S:-540} s by SIGINT (it restores every file and resumes later)
  CS=/tmp/kinv-campaign; rm -rf "$CS"
  /usr/bin/time -f "campaign wall %e s" timeout -s INT "${CAMPAIGN_S:-540}" python3 -m kinv.agent.cli.app campaign \
    plans/7-decode-ceiling.yaml --backend cuda --approval auto --state-dir "$CS" 2>&1 | grep -v "\] round" | tail -40
  timeout -s INT 30 python3 -m kinv.agent.cli.app campaign plans/7-decode-ceiling.yaml --backend cuda --approval auto --state-dir "$CS" \
    --json > "$OUT/campaign-live.json" 2>/dev/null || true
  python3 -m kinv.agent.cli.app status --state-dir "$CS" | head -60
  tar czf "$OUT/campaign-state.tgz" -C "$CS" . ; git diff --stat kernels/configs
fi
for plan in ${PLANS:-3a-attention-occupancy 3c-null-batch-aware 6a-fault-drill 6b-source-null}; do
  [ "$plan" = none ] && continue
  /usr/bin/time -f "wall %e s" python3 -m kinv.agent.cli.app run plans/$plan.yaml --backend cuda --approval auto \
    --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -16
done
for ws in 3a 3c 6a 6b; do python3 -m kinv.agent.cli.app experiments $ws --state-dir "$ST" 2>/dev/null; done
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-h200.db"
git status --short kernels plans
