#!/usr/bin/env bash
# #10a's screening on one GPU in one call: the persistent stage 1 (plans/patches/10a-persistent-stage1.diff,
# applied here and taken back at the end), its GPU tests, then every level of the goal at the contexts in
# CONTEXTS (default 4096) for the shipped config file with and without PERSISTENT (mla_ceiling.py --grid persistent).
# Needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
# the tests apply the patch to a copy of their own: before it is applied here
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_mla_persistent.py 2>&1 | tail -4
git apply plans/patches/10a-persistent-stage1.diff || exit 1
trap 'git checkout -q kernels/mla_decode.py' EXIT
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout -s INT ${GRID_S:-330} python3 benchmarks/mla_ceiling.py --grid persistent --contexts "${CONTEXTS:-4096}" \
  --jobs 7 --out "$OUT/mla_ceiling_persistent.json" 2>&1 | grep -v "^$"
