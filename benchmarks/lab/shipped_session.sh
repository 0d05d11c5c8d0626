#!/usr/bin/env bash
# Records the shipped config file on the H200 so that the replay backend serves it (kinv bench, kinv noise and
# kinv bench --variant num_warps=8 on a machine with no GPU), beside the configs an adoption compares it with:
# #3b V1 (BT32), and the seed's BT16 and the BT64/w8 and BT64/w4 that campaign #7 on replay chooses per level
# (its final config is confirmed against the shipped file before it is written). `--space PLAN` would add a
# campaign's whole space to the session (70 workers for plans/7-decode-ceiling.yaml, about 10 minutes).
# Runs from a checkout with nothing installed; needs the wheels of .whl/ on PYTHONPATH (see benchmarks/gpu_session.sh).
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kinv-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
/usr/bin/time -f "record wall %e s" python3 benchmarks/record.py --plan plans/3a-attention-occupancy.yaml \
  --configs kernels/configs/mla_decode.json \
  '{"BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}' \
  '{"BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2}' \
  '{"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}' \
  '{"BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}' \
  --variant num_warps=8 --rounds 32 --replicas 4 --jobs 12 \
  --out "$OUT/mla_decode-v4flash-shipped.jsonl.gz" 2>&1 | grep -v "^# round [0-9]*[1-9] "
# the shipped file timed live by kinv itself, for comparison with its replay
python3 -m kinv.agent.cli bench --backend cuda --state-dir /tmp/kinv-bench 2>&1 | tail -8
