#!/usr/bin/env bash
# Wall time per GPU second of #3a on the H200 with benchmark workers kept between arms and without
# (KINV_REUSE_WORKERS=0), one after the other in one call; then campaign #7 with reuse if CAMPAIGN=1.
# Needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
for reuse in ${REUSE:-0 1}; do
  ST=/tmp/kinv-3a-reuse$reuse; rm -rf "$ST"
  KINV_REUSE_WORKERS=$reuse /usr/bin/time -f "3a reuse=$reuse process wall %e s" python3 -m kinv.agent.cli run \
    plans/3a-attention-occupancy.yaml --backend cuda --approval auto --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -8
  echo "== 3a reuse=$reuse"; python3 benchmarks/wall_breakdown.py "$ST"
  python3 benchmarks/wall_breakdown.py "$ST" --json > "$OUT/3a-reuse$reuse.json"
  cp "$ST/reports/3a-closeout.md" "$OUT/3a-closeout-reuse$reuse.md"; cp "$ST/kinv.log" "$OUT/3a-reuse$reuse.log"
done
if [ -n "$CAMPAIGN" ]; then
  CS=/tmp/kinv-campaign; rm -rf "$CS"
  /usr/bin/time -f "campaign process wall %e s" timeout -s INT "${CAMPAIGN_S:-400}" python3 -m kinv.agent.cli campaign \
    plans/7-decode-ceiling.yaml --backend cuda --approval auto --state-dir "$CS" 2>&1 | grep -v "\] round" | tail -12
  timeout -s INT 30 python3 -m kinv.agent.cli campaign plans/7-decode-ceiling.yaml --backend cuda --approval auto \
    --state-dir "$CS" --json > "$OUT/campaign-live.json" 2>/dev/null || true
  echo "== campaign"; python3 benchmarks/wall_breakdown.py "$CS"
  python3 benchmarks/wall_breakdown.py "$CS" --json > "$OUT/campaign-breakdown.json"; cp "$CS/kinv.log" "$OUT/campaign.log"
fi
git status --short kernels plans
