#!/usr/bin/env bash
# Plan 3e live on the H200: TARGET_CTAS as variants over the environment, each arm's workers checked in their
# own environment (figures in benchmarks/RESULTS.md). Needs the wheels in .whl/ (benchmarks/gpu_session.sh).
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
ST=/tmp/kinv-env; rm -rf "$ST"
/usr/bin/time -f "3e wall %e s" python3 -m kinv.agent.cli run plans/3e-target-ctas.yaml --backend cuda \
  --approval auto --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -30
python3 -m kinv.agent.cli experiments 3e --state-dir "$ST"
python3 - "$ST/kinv.db" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for row in db.execute("select e.variant, c.source, c.ok, c.expected, c.seen from env_checks c "
                      "left join experiments e on e.id = c.experiment order by c.id"):
    print("env check", row)
PY
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-env-h200.db"
git status --short kernels
