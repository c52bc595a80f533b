#!/usr/bin/env bash
# flash_decode tuning sweep in one device run: the decode kernel (1 GPU) and the distributed op
# (2 GPUs) under forced split counts on the small-KV shapes that decide the heuristic,
# plus the heuristic's own plan on the issue's shapes. Every case is also checked (-c 1).
#
#   scripts/decode_sweep.sh OUT_DIR [auto|splits|odd|wide|ragged|paged|dist|all]...   (default: all)
#
# Sections: auto   `bench decode`, every issue shape, the heuristic's plan
#           splits `bench decode`, b=1 8K/32K/128K, b=4 8K (96/12) and b=1 4K/16K (64/8):
#                  split counts
#           odd    `bench decode` on odd lengths (12345, 1, 100) with the heuristic's plan
#           wide   `bench decode` where batch x KV heads nears or passes the SMs (128-384 groups):
#                  the heuristic's plan and split counts 1-8 (r196, r200)
#           ragged `bench decode` on ragged batches (lengths in [1, L]): batch 4-32, both head
#                  sets, the heuristic's plan and split counts 1-16 (r204: the max_len plan's gap)
#           paged  `bench decode` on paged caches (pages 16, 64, 256; HND and NHD) beside the
#                  contiguous cache (r202)
#           dist   `bench flash_decode -g 2` (every variant and part) at KV <= 32K per
#                  rank: the heuristic's plan and forced 8/11/16/22 splits
# Writes OUT_DIR/decode_<section>.{json,log}; "# plan:" lines in the logs give each case's split
# count. Binaries come from ./build. Exit code: the number of failed sections (a wrong
# element fails its section).
set -u -o pipefail
out=${1:?usage: scripts/decode_sweep.sh OUT_DIR [auto|splits|odd|wide|ragged|paged|dist|all]...}
shift
sections=${*:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
bin=build/taxfree

. scripts/sweep_env.sh
# run SECTION OP GPUS [bench args...]: one bench invocation over the collected entries, then clear them.
run() {
  local name=$1 op=$2 gpus=$3; shift 3
  local t0=$SECONDS
  timeout -k 10 560 "$bin" bench "$op" -g "$gpus" -c 1 --json "$out/decode_$name.json" "$@" "${entries[@]}" \
    >"$out/decode_$name.log" 2>&1
  local rc=$?
  echo "=== $name: ${#entries[@]} args, exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  entries=()
}

if want auto; then
  run auto decode 1
fi

if want splits; then
  for s in "batch=1,kv=8192,heads=96/12" "batch=1,kv=32768,heads=96/12"; do
    for n in 4 6 8 11 16 22 33; do add "$s,splits=$n"; done
  done
  for n in 11 22; do add "batch=1,kv=131072,heads=96/12,splits=$n"; done
  for n in 1 2 3 5; do add "batch=4,kv=8192,heads=96/12,splits=$n"; done
  for s in "batch=1,kv=4096,heads=64/8" "batch=1,kv=16384,heads=64/8"; do
    for n in 4 8 12 16 24 33; do add "$s,splits=$n"; done
  done
  run splits decode 1
fi

if want odd; then
  for kv in 12345 1 100; do add "batch=1,kv=$kv"; add "batch=3,kv=$kv,heads=64/8,head_dim=64"; done
  run odd decode 1
fi

if want wide; then
  for s in "batch=16,kv=8192,heads=96/12" "batch=16,kv=32768,heads=96/12" "batch=32,kv=16384,heads=64/8" \
           "batch=16,kv=16384,heads=64/8" "batch=12,kv=16384,heads=96/12" "batch=17,kv=32768,heads=64/8" \
           "batch=48,kv=8192,heads=64/8" "batch=16,kv=2048,heads=96/12"; do
    add "$s"
    for n in 1 2 3 4 6 8; do add "$s,splits=$n"; done
  done
  run wide decode 1
fi

if want ragged; then
  for s in "batch=4,kv=32768,heads=96/12" "batch=16,kv=65536,heads=96/12" "batch=8,kv=65536,heads=64/8" \
           "batch=32,kv=32768,heads=64/8" "batch=8,kv=16384,heads=96/12" "batch=32,kv=8192,heads=64/8"; do
    add "$s,ragged=1"
    for n in 1 2 4 8 16; do add "$s,ragged=1,splits=$n"; done
  done
  run ragged decode 1
fi

if want paged; then
  for s in "batch=1,kv=32768,heads=96/12" "batch=16,kv=32768,heads=96/12" "batch=1,kv=4096,heads=64/8"; do
    add "$s"
    for p in "page=16" "page=16,layout=nhd" "page=64" "page=256,layout=nhd"; do add "$s,$p"; done
  done
  run paged decode 1
fi

if want dist; then
  for s in "batch=1,kv=8192,heads=96/12" "batch=1,kv=32768,heads=96/12" "batch=4,kv=8192,heads=96/12" \
           "batch=1,kv=4096,heads=64/8" "batch=1,kv=16384,heads=64/8"; do
    add "$s"
  done
  for s in "batch=1,kv=8192,heads=96/12" "batch=1,kv=32768,heads=96/12"; do
    for n in 8 11 16 22; do add "$s,splits=$n"; done
  done
  run dist flash_decode 2
fi

for f in "$out"/decode_*.log; do
  [ -e "$f" ] || continue
  echo "--- $f"
  head -c 12000 "$f"
done
echo "failed sections: $failed"
exit $failed
