#!/usr/bin/env bash
# The measurement core, live in one device call: #3a before (the previous main, unpacked into .old/) and after,
# the harness drill (plans/6c-harness-drill.yaml) and the fault drill (plans/6a-fault-drill.yaml).
# Runs from a source checkout with nothing installed; needs the wheels of pydantic, sqlite-utils, langgraph and
# their needs (carried in .whl/, installed to /tmp/site and put on PYTHONPATH by the caller).
#   STEPS="new drill old fault"   which runs, in that order (default: all four)
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
here=$(pwd)

summary() {  # state dir, label: each experiment's verdict, rounds, GPU s and wall s, and the run's totals
  python3 - "$1" "$2" <<'EOF'
import json, sqlite3, sys
db = sqlite3.connect(f"{sys.argv[1]}/kinv.db")
db.row_factory = sqlite3.Row
rows = db.execute("select id, workstream, variant, kind, verdict, rounds, gpu_s, wall_s, reason from experiments "
                  "order by id").fetchall()
out = [dict(r) for r in rows]
for r in out:
    print(f"{sys.argv[2]} {r['workstream']} {r['variant']:>8} {r['kind']:>6} {str(r['verdict']):>12} "
          f"rounds={r['rounds']} gpu_s={r['gpu_s'] or 0:.2f} wall_s={r['wall_s'] or 0:.1f} {str(r['reason'])[:260]}")
gpu = sum(r["gpu_s"] or 0 for r in out)
print(f"{sys.argv[2]} total GPU s {gpu:.2f}")
json.dump(out, open(f"{sys.argv[1]}/experiments.json", "w"), indent=1, default=str)
EOF
}

run() {  # checkout dir, state dir, plan, label
  rm -rf "$2"
  (cd "$1" && /usr/bin/time -f "$4 wall %e s" python3 -m kinv.agent.cli run "plans/$3.yaml" --backend cuda \
     --approval auto --state-dir "$2" 2>&1 | grep -v "\] round" | tail -30)
  summary "$2" "$4"
}

for step in ${STEPS:-new drill old fault}; do
  case $step in
    old) run "$here/.old" /tmp/st-old 3a-attention-occupancy before ;;
    new) run "$here" /tmp/st-new 3a-attention-occupancy after
         grep -h "checked in" /tmp/st-new/kinv.log | python3 -c "import sys,re; v=[float(re.search(r'checked in ([0-9.]+) s', l).group(1)) for l in sys.stdin]; print(f'timed-capture checks: {len(v)}, {sum(v):.2f} s in all, {max(v) if v else 0:.3f} s at most')"
         cp /tmp/st-new/reports/*.md "$OUT/" 2>/dev/null; cp /tmp/st-new/kinv.db "$OUT/kinv-3a.db" ;;
    drill) run "$here" /tmp/st-drill 6c-harness-drill drill
           cp /tmp/st-drill/reports/*.md "$OUT/" 2>/dev/null; cp /tmp/st-drill/kinv.db "$OUT/kinv-6c.db"
           grep -h "checked in\|Tampered\|incorrect" /tmp/st-drill/kinv.log | tail -20 ;;
    fault) run "$here" /tmp/st-fault 6a-fault-drill fault
           cp /tmp/st-fault/reports/*.md "$OUT/" 2>/dev/null ;;
  esac
done
git -C "$here" status --short kernels plans
