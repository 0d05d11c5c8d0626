#!/usr/bin/env bash
# Campaign #7 (plans/7-decode-ceiling.yaml) live on a node of H200s, one call per mode, from the
# seed's BT16/w4/s2, timed end to end.
#   MODE=ray    kinv campaign ... --executor ray   (one Ray actor per GPU of the node, `ray.init()` local)
#   MODE=local  kinv campaign ...                  (one process, CUDA_VISIBLE_DEVICES=0: one GPU)
#   KILL=1      with MODE=ray: actor 1 dies (os._exit) the first time it is sent an A/A or A/B round; a new
#               actor takes its place, the round runs again, and the close-out of that workstream says so
# The live config is a temporary copy (KINV_CONFIG_DIR): --approval auto writes the chosen config there, never
# into the checkout.  Runs from a checkout with nothing installed; the wheels of .whl/ (Ray among them) go on
# PYTHONPATH first:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
MODE=${MODE:-ray}
FINAL=${OUT:-/tmp/kinv-out}; OUT=/tmp/kinv-ray-$MODE${KILL:+-kill}; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
ST=/tmp/kinv-state-16-$MODE${KILL:+-kill}; rm -rf "$ST" "$ST.fault"; CFG=/tmp/kinv-cfg-16-$MODE${KILL:+-kill}; rm -rf "$CFG"; mkdir -p "$CFG"
cp kernels/configs/mla_decode.json "$CFG/"
# a cold Triton cache for each run: a run never reuses another's compiles (the first H200 runs did: see RESULTS)
export KINV_STATE_DIR="$ST" KINV_CONFIG_DIR="$CFG" TRITON_CACHE_DIR="/tmp/triton-cache-16-$MODE${KILL:+-kill}"
rm -rf "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=index,name,pci.bus_id --format=csv,noheader
args=(campaign plans/7-decode-ceiling.yaml --backend cuda --approval auto --json)
if [ "$MODE" = ray ]; then args+=(--executor ray); else export CUDA_VISIBLE_DEVICES=0; fi
if [ -n "$KILL" ]; then
  export KINV_EXECUTOR_FAULT="sample:actor1@" KINV_EXECUTOR_FAULT_MARKER="$ST.fault"; MODE=$MODE-kill
fi
t0=$(date +%s.%N)
python3 -m kinv.agent.cli "${args[@]}" > "$OUT/campaign.json" 2> "$OUT/campaign.err"; rc=$?
t1=$(date +%s.%N)
python3 - "$OUT/campaign.json" "$t0" "$t1" "$rc" "$MODE" > "$OUT/wall.json" <<'PY'
import json, sys
path, t0, t1, rc, mode = sys.argv[1:]
try:
    d = json.load(open(path))
except ValueError:
    d = {}
print(json.dumps({"mode": mode, "rc": int(rc), "wall_s": round(float(t1) - float(t0), 1),
                  "levels": {k: v.get("config") for k, v in d.get("levels", {}).items()},
                  "chain": [(w.get("ws"), w.get("item"), w.get("verdicts")) for w in d.get("workstreams", [])],
                  "gpu_s": d.get("gpu_seconds"), "samples": d.get("samples")}, indent=1))
PY
cat "$OUT/wall.json"; ls "$ST.fault" 2>/dev/null && echo "the planted actor death fired"; grep -v "\] round" "$OUT/campaign.err" | tail -25
cp "$ST"/reports/*.md "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv-16-$MODE.db" 2>/dev/null
cp "$ST/kinv-errors.log" "$OUT"/ 2>/dev/null
tar czf "$FINAL/ray-campaign-$MODE.tgz" -C "$OUT" . && ls -la "$OUT" | tail -20
