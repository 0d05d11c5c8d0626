#!/usr/bin/env bash
# The kinv.kernels.quick example (benchmarks/examples/quick_matmul) on the H200: its replay recordings, recorded
# into the example package's own recordings dir (where the replay backend looks for a plugin's recordings), their
# compiled resources beside them, then both of its plans live.
# Runs from a checkout with nothing installed; needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
#   ROUNDS=32 AA_ROUNDS=16  the recordings' A/B and A/A rounds      PLANS="plan plan-autotune"  the plans run live
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
EX="$PWD/benchmarks/examples/quick_matmul"
PKG="$EX/kinv_quick_matmul"
REC="$PKG/recordings/h200"
# (i) the example importable without pip install (no package index on the GPU machine): its folder on PYTHONPATH,
# and its two entry points as an installed distribution would declare them (a dist-info folder on PYTHONPATH), so
# that every kinv process, the workers included, finds quick_matmul and quick_matmul_autotune by name. A plan may
# instead name the class (kernel: kinv_quick_matmul.adapter:QuickMatmul); benchmarks/record_compiled.py asks the
# workers for a kernel by the name its recording's header gives, which needs the entry points.
SITE=/tmp/kinv-quick-site; rm -rf "$SITE"; mkdir -p "$SITE/kinv_quick_matmul-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: kinv-quick-matmul\nVersion: 0.1.0\n' > "$SITE/kinv_quick_matmul-0.1.0.dist-info/METADATA"
cat > "$SITE/kinv_quick_matmul-0.1.0.dist-info/entry_points.txt" <<'TXT'
[kinv.kernels]
quick_matmul = kinv_quick_matmul.adapter:QuickMatmul
quick_matmul_autotune = kinv_quick_matmul.adapter_autotune:QuickMatmulAutotune
TXT
export PYTHONPATH="$EX:$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
K="python3 -m kinv.agent.cli"
$K kernels 2>&1 | tail -6
# (ii) the recordings: one file per plan (its baseline, config variants, levels, A/A), then the compiled figures of
# every recorded config at every level (compiled.json, served by replay beside the samples)
mkdir -p "$REC"
python3 benchmarks/record.py --plan "$EX/plan.yaml" --rounds "${ROUNDS:-32}" --aa-rounds "${AA_ROUNDS:-16}" \
  --aa-arms 4 --out "$REC/quick_matmul.jsonl.gz" 2>&1 | grep -v "^# round" | tail -8
python3 benchmarks/record.py --plan "$EX/plan-autotune.yaml" --rounds "${ROUNDS:-32}" --aa-rounds "${AA_ROUNDS:-16}" \
  --aa-arms 4 --out "$REC/quick_matmul_autotune.jsonl.gz" 2>&1 | grep -v "^# round" | tail -8
python3 benchmarks/record_compiled.py --recordings "$REC" --out "$REC" 2>&1 | tail -4
mkdir -p "$OUT/recordings/h200" && cp "$REC"/* "$OUT/recordings/h200/"
# (iii) the plans live on the GPU, into a state dir under $OUT
ST="$OUT/quick-state"; rm -rf "$ST"
for plan in ${PLANS:-plan plan-autotune}; do
  /usr/bin/time -f "$plan wall %e s" $K run "$EX/$plan.yaml" --backend cuda --approval auto --state-dir "$ST" 2>&1 \
    | grep -v "\] round" | tail -20
done
$K experiments 20a --state-dir "$ST" 2>/dev/null; $K experiments 20b --state-dir "$ST" 2>/dev/null
# and once more on replay from the new recordings, to see that they serve both plans
RS="$OUT/quick-replay-state"; rm -rf "$RS"
for plan in ${PLANS:-plan plan-autotune}; do
  $K run "$EX/$plan.yaml" --backend replay --approval auto --state-dir "$RS" 2>&1 | grep -v "\] round" | tail -6
done
git status --short "$EX"
