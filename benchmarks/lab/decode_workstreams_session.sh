#!/usr/bin/env bash
# Workstreams #8a and #8b live on the H200, in one call: #8a (the kernel source patch) and #8b (per-level configs of the
# patched kernel) run by kinv, each adopted through `kinv adopt` when it wins; then the shipped config file
# timed at every level of the goal and put through the correctness gate.
# Runs from a checkout with nothing installed; needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
# #9a and #9b the same way: WS="9a 9b" ADOPT_ORDER="S1 V1" OUT=... bash benchmarks/lab/decode_workstreams_session.sh (#9a, #9b).
# #10a (persistent stage 1, not yet run live): first `python3 -m pytest -q -m gpu tests/kernels/test_mla_persistent.py`,
# then WS=10a ADOPT_ORDER="S3 S2 S1" OUT=... bash benchmarks/lab/decode_workstreams_session.sh.
export PYTHONUNBUFFERED=1
FINAL=${OUT:-/tmp/kinv-out}; OUT=/tmp/kinv-decode; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
ST=/tmp/kinv-state-${WS:-8}; ST=${ST// /}; rm -rf "$ST"
kinv() { python3 -m kinv.agent.cli "$@"; }
for ws in ${WS:-8a 8b}; do
  plan=$(ls plans/$ws-*.yaml)
  /usr/bin/time -f "$ws wall %e s" python3 -m kinv.agent.cli run "$plan" --backend cuda --approval auto \
    --state-dir "$ST" 2>&1 | grep -v "\] round" | tail -14
  kinv experiments "$ws" --state-dir "$ST" 2>/dev/null | tail -12
  adopted=""
  for v in ${ADOPT_ORDER:-S3 S2 S1 V1}; do
    if kinv adopt "$ws" "$v" --yes --state-dir "$ST" > "$OUT/adopt-$ws-$v.txt" 2>&1; then
      adopted=$v; echo "adopted $ws $v"; tail -12 "$OUT/adopt-$ws-$v.txt"; break
    fi
  done
  # #8b's (#9b's) configs mean something only on the patched kernel
  [ -z "$adopted" ] && { echo "nothing of $ws adopted"; tail -n 3 "$OUT"/adopt-$ws-*.txt; break; }
done
git diff --stat kernels; git diff kernels/configs > "$OUT/configs.diff"; cp kernels/configs/mla_decode.json "$OUT/"
for ctx in ${GATE_CONTEXTS:-4096}; do python3 benchmarks/mla_gate.py --context $ctx --out "$OUT/mla_gate_$ctx.json" 2>&1 | tail -3; done
timeout -s INT ${TABLE_S:-200} python3 benchmarks/mla_ceiling.py --grid shipped --jobs 2 \
  --out "$OUT/mla_ceiling_shipped.json" 2>&1 | grep -v "^$" | tail -16
cp "$ST"/reports/* "$OUT"/ 2>/dev/null; cp "$ST/kinv.db" "$OUT/kinv.db"
cp "$ST"/adoptions/* "$OUT"/ 2>/dev/null; sha256sum kernels/mla_decode.py
tar czf "$FINAL/decode.tgz" -C "$OUT" . && ls -la "$OUT"
