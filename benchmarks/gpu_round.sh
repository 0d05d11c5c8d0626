#!/usr/bin/env bash
# One device call for this round's live figures, from a source checkout with nothing installed (the wheels of
# pydantic, sqlite-utils, langgraph and their needs installed to /tmp/site and put on PYTHONPATH by the caller):
#   occupancy  plans/occupancy-premise.yaml live, with its profile step, close-out copied to $OUT
#   3a         plans/3a-attention-occupancy.yaml live (the seed's investigation on today's layout)
#   ceiling    benchmarks/mla_ceiling.py --grid shipped (the shipped file, every goal level, copy bandwidth)
#   STEPS="occupancy 3a ceiling"   which runs, in that order (default: all three)
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
kinv() { python3 -m kinv.agent.cli.app "$@"; }
for step in ${STEPS:-occupancy 3a ceiling}; do
  case $step in
    occupancy)
      python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mla_decode.py -k register_cap 2>&1 | tail -5
      export KINV_STATE_DIR=/tmp/st-occ; rm -rf $KINV_STATE_DIR
      /usr/bin/time -f "occupancy wall %e s" python3 -m kinv.agent.cli.app run plans/occupancy-premise.yaml \
        --backend cuda --approval auto 2>&1 | grep -v "\] round" | tail -40
      cp $KINV_STATE_DIR/reports/* "$OUT/" 2>/dev/null; cp $KINV_STATE_DIR/kinv.db "$OUT/kinv-occupancy.db"
      python3 -m kinv.agent.cli.app experiments 3f 2>&1 | tail -12; unset KINV_STATE_DIR ;;
    3a)
      export KINV_STATE_DIR=/tmp/st-3a; rm -rf $KINV_STATE_DIR
      /usr/bin/time -f "3a wall %e s" python3 -m kinv.agent.cli.app run plans/3a-attention-occupancy.yaml \
        --backend cuda --approval auto 2>&1 | grep -v "\] round" | tail -30
      python3 -m kinv.agent.cli.app experiments 3a 2>&1 | tail -8
      cp $KINV_STATE_DIR/reports/3a-closeout.md "$OUT/3a-closeout-live.md"; cp $KINV_STATE_DIR/kinv.db "$OUT/kinv-3a.db"
      unset KINV_STATE_DIR ;;
    ceiling)
      python3 benchmarks/mla_ceiling.py --grid shipped --samples 7 --out "$OUT/mla_ceiling_shipped.json" 2>&1 | tail -30 ;;
  esac
done
git status --short kernels plans 2>/dev/null
