#!/usr/bin/env bash
# The short-last-m-block rule's check (docs/notes/gemm-tuning.md, "Short last m-blocks"): on the
# shapes of the grid M = 64-2048 step 32, N = 512-14336 (15 values), K = 2048 / 4096 / 8192 / 16384
# whose choice the rule changes and that r328-r329 did not time, the previous choice and the rule's
# forced side by side (scripts/short_m_block_forced.txt, two rounds), then the heuristic's choices
# against cuBLASLt (scripts/short_m_block_shapes.txt). One GPU, under a minute.
# Usage: scripts/short_m_block_check.sh OUT_DIR [BIN]   (BIN: build/taxfree)
set -u
o=${1:?usage: scripts/short_m_block_check.sh OUT_DIR [BIN]}
b=${2:-build/taxfree}
mkdir -p "$o"
cd "$(dirname "$0")/.."
. scripts/sweep_env.sh
shapes() { local e=() s; while read -r s; do e+=(--shape "$s"); done < "$1"; printf '%s\n' "${e[@]}"; }
mapfile -t forced < <(shapes scripts/short_m_block_forced.txt)
mapfile -t heur < <(shapes scripts/short_m_block_shapes.txt)
rc=0
for r in 1 2; do
  timeout -k 5 200 "$b" bench gemm -g 1 -c 1 -n 20 --variant ours "${forced[@]}" --json "$o/forced$r.json" > "$o/forced$r.log" 2>&1 || rc=$((rc + 1))
done
timeout -k 5 200 "$b" bench gemm -g 1 -c 1 -n 20 "${heur[@]}" --json "$o/heur.json" > "$o/heur.log" 2>&1 || rc=$((rc + 1))
exit $rc
