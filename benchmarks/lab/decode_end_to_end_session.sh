#!/usr/bin/env bash
# Plan 3d live on one GPU: the seed's loop end to end (benchmarks/examples/decode_step.py through the command
# backend's server mode), after a one-level smoke run of the decode step. Needs the wheels of .whl/ on PYTHONPATH
# (see benchmarks/gpu_session.sh).   RUN_S=520  seconds before the run is interrupted (it restores and resumes)
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
K="python3 -m kinv.agent.cli"
# (i) one level of the step, timed alone: the layer builds, both kernels pass their references, one JSON line
/usr/bin/time -f "smoke wall %e s" env TARGET_CTAS=512 KINV_MLA_CONFIG=plans/configs/3d-seed-bt16.json \
  python3 benchmarks/examples/decode_step.py run --concurrency 8 --seconds 0.5 || exit 1
# (ii) plan 3d live, its state under $OUT
ST="$OUT/3d-state"; rm -rf "$ST"
/usr/bin/time -f "3d wall %e s" timeout -s INT "${RUN_S:-520}" $K run plans/3d-end-to-end.yaml --backend command \
  --approval auto --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -60
$K experiments 3d --state-dir "$ST" 2>&1 | tail -40
$K report 3d --state-dir "$ST" --json > "$OUT/3d-report.json" 2>/dev/null
python3 - "$ST/kinv.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for row in db.execute("select e.variant, c.source, c.ok, c.expected, c.seen from env_checks c "
                      "left join experiments e on e.id = c.experiment order by c.id"):
    print("env check", row)
PY
du -sh "$ST"; git status --short kernels plans
