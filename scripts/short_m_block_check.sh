#!/usr/bin/env bash
# The short-last-m-block rule's check (docs/notes/gemm-tuning.md, "Short last m-blocks"): main's
# heuristic (BIN_A) against this branch's (BIN_B) in alternating rounds on the 95 shapes of the grid
# (M = 64-2048 step 32, N = 512-14336, K = 8192) whose choice it changes and five more from r327,
# then this branch's choices against cuBLASLt. One GPU, ~1 min.
# Usage: scripts/short_m_block_check.sh OUT_DIR BIN_A [BIN_B]   (BIN_B: build/taxfree)
set -u
o=${1:?usage: scripts/short_m_block_check.sh OUT_DIR BIN_A [BIN_B]}
a=${2:?BIN_A}
b=${3:-build/taxfree}
mkdir -p "$o"
cd "$(dirname "$0")/.."
e=()
while read -r s; do e+=(--shape "$s"); done < scripts/short_m_block_shapes.txt
scripts/ab_bench.sh "$o/ab" "$a" "$b" 2 -- gemm -g 1 -c 1 -n 20 --variant ours "${e[@]}" > "$o/ab.txt" 2>&1
echo "=== ab rc $?"
. scripts/sweep_env.sh
timeout -k 5 200 "$b" bench gemm -g 1 -c 1 -n 20 "${e[@]}" --json "$o/heur.json" > "$o/heur.log" 2>&1
echo "=== heur rc $?"
