#!/usr/bin/env bash
# What Nsight Compute prints on this machine for the #3a baseline and V1 (num_warps 8) at V4-Flash/4096, b8 and
# b64: the raw page as CSV (the profile step's parser is written against it) and the details page once.
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
which ncu; ncu --version | tail -1
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section SchedulerStats --section MemoryWorkloadAnalysis)
for w in 4 8; do for b in 8 64; do
  job="{\"kernel\":\"mla_decode\",\"config\":{\"kernel\":\"mla_decode\",\"BLOCK_T\":16,\"BLOCK_H\":16,\"num_warps\":$w,\"num_stages\":2},\"level\":{\"shape\":\"v4flash\",\"heads\":16,\"page_size\":64,\"context\":4096,\"batch\":$b},\"launches\":2}"
  t0=$(date +%s.%N)
  TARGET_CTAS=512 timeout 300 ncu --clock-control none --profile-from-start off --kernel-name regex:_mla_decode_stage1 \
    "${sections[@]}" --csv --page raw python3 -m kinv.agent.tools.profile_target "$job" > "$OUT/raw_w${w}_b${b}.csv" 2> "$OUT/raw_w${w}_b${b}.err"
  echo "w$w b$b: rc $? $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"
done; done
TARGET_CTAS=512 timeout 300 ncu --clock-control none --profile-from-start off --kernel-name regex:_mla_decode_stage1 \
  "${sections[@]}" --csv --page details python3 -m kinv.agent.tools.profile_target "$job" > "$OUT/details_w8_b64.csv" 2>&1
echo "details rc $?"
