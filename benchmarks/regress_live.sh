#!/usr/bin/env bash
# kinv regress live on a GPU, the three runs RESULTS.md reports: the seed's kernel against today's, a revision
# against itself (never improved or regressed), and a planted slowdown (it must be regressed), each with its wall
# time.  Run from the root of a git checkout of kinv on the GPU machine:
#
#   bash benchmarks/regress_live.sh [OUT_DIR]        # default benchmarks/results/regress_live_<gpu>
#
# The checkout is read, never switched or written: the planted revision is a commit made with git's plumbing (a
# temporary index, no branch, no worktree) whose only change is the shipped config with num_warps 8 (recorded 2.4%,
# 5.5% and 3.9% slower at b32, b64 and b96 on the H200).  A machine with the files but not the history (a copy of a
# working tree) needs the history first: where it is, `git bundle create kinv.bundle HEAD`; there,
# `git clone -q kinv.bundle /tmp/kinv && cd /tmp/kinv && bash benchmarks/regress_live.sh $OUT`.
set -u
cd "$(git rev-parse --show-toplevel)" || exit 2
PY=$(command -v python || command -v python3)
gpu=$($PY -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())" 2>/dev/null || echo nogpu)
out=${1:-benchmarks/results/regress_live_$gpu}
mkdir -p "$out"
export KINV_STATE_DIR=${KINV_STATE_DIR:-$out/state}
# the seed's kernel: the earliest revision whose kernel takes the harness's per-sample scratch argument, with the
# seed's config (BT16/w4/s2); its adapter predates today's harness, so only its kernel source and config are taken
SEED=${SEED:-bb5214a}
BACKEND=${BACKEND:-cuda}  # BACKEND=replay: a dry run on CPU (the seed's source is not recorded: refused, exit 2)

run() {
  local name=$1; shift
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$PY" -m kinv.agent.cli.app regress "$@" --backend "$BACKEND" --markdown "$out/$name.md" --json "$out/$name.json" \
    --junit "$out/$name.xml" > "$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  printf '%s: exit %s, wall %.0f s: kinv regress %s\n' "$name" "$rc" "$("$PY" -c "print($t1 - $t0)")" "$*" | tee -a "$out/summary.txt"
}

# the planted revision: HEAD's tree with num_warps 8 in the shipped config, as a commit only git's objects hold
tmp=$(mktemp -d)
blob=$(git show HEAD:kernels/configs/mla_decode.json \
  | "$PY" -c "import json, sys; d = json.load(sys.stdin); assert d['num_warps'] == 4; d['num_warps'] = 8; print(json.dumps(d, indent=2))" \
  | git hash-object -w --stdin)
GIT_INDEX_FILE=$tmp/index git read-tree HEAD
GIT_INDEX_FILE=$tmp/index git update-index --cacheinfo "100644,$blob,kernels/configs/mla_decode.json"
tree=$(GIT_INDEX_FILE=$tmp/index git write-tree)
planted=$(git -c user.name=kinv -c user.email=kinv@localhost commit-tree "$tree" -p HEAD -m "planted slowdown: num_warps 8")
rm -rf "$tmp"

: > "$out/summary.txt"
run seed-vs-today "$SEED" HEAD --kernel mla_decode --kernel-sources-only
run self HEAD HEAD --kernel mla_decode
run planted HEAD "$planted"
"$PY" -m kinv.agent.cli.app regress --history mla_decode > "$out/history.txt" 2>&1
cat "$out/summary.txt"
