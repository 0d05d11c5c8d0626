#!/usr/bin/env bash
# #9d screening on the H200 in one call (benchmarks/RESULTS.md, "The kernel"): the one-pass MERGE merge
# (benchmarks/lab/patches/9d-merge-one-pass.diff, applied here and taken back at the end) against the committed source,
# V3 and V4-Flash at context 4096, batch >= 32 (mla_ceiling.py --grid tail); on the patched source also the
# correctness gate with MERGE at every batch and the GPU lane of the MERGE tests.
# Needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
git apply benchmarks/lab/patches/9d-merge-one-pass.diff || exit 1
trap 'git checkout -q kernels/mla_decode.py' EXIT
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 benchmarks/mla_ceiling.py --grid tail --contexts 4096 --min-batch 32 --jobs 8 --out "$OUT/tail_new_h200.json" 2>&1 | grep -v "^$"
python3 benchmarks/mla_gate.py --config benchmarks/results/decode_kernel/merge_all_config.json \
  --out "$OUT/gate_merge_all_new_h200.json" 2>&1 | tail -3
timeout 120 python3 -m pytest -q -m gpu tests/kernels/test_mla_decode.py -k "merge" 2>&1 | tail -2
git checkout -q kernels/mla_decode.py
python3 benchmarks/mla_ceiling.py --grid tail --contexts 4096 --min-batch 32 --jobs 8 --out "$OUT/tail_old_h200.json" 2>&1 | grep -v "^$"
