#!/usr/bin/env bash
# Nsight Compute reports of the shipped MLA config at the goal's levels that miss 80% of copy bandwidth
# (V3 and V4-Flash at 4096, batch 32 and 64), and at V3/16384/b64 (92%) for contrast. One call on the H200;
# the reports land in $OUT as text. ncu needs --clock-control none here (the device README).
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section SchedulerStats --section MemoryWorkloadAnalysis)
for lv in v3/4096/32 v3/4096/64 v4flash/4096/32 v3/16384/64 v3/4096/1; do
  name=${lv//\//_}
  timeout 300 ncu --clock-control none --kernel-name regex:_mla_decode --launch-skip 4 --launch-count 2 \
    "${sections[@]}" python3 benchmarks/lab/mla_profile.py --level "$lv" > "$OUT/ncu_$name.txt" 2>&1
  echo "$lv: rc $? $(grep -c 'Duration' "$OUT/ncu_$name.txt") kernels"
done
