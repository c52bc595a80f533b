#!/usr/bin/env bash
# A/B of two builds on the same GPUs in one call: the bench of binary A and of binary B in
# alternating rounds (A B B A A B ...: neither always runs first, clocks and power drift evenly),
# then scripts/ab_compare.py over all rounds.
#
#   scripts/ab_bench.sh OUT_DIR BIN_A BIN_B ROUNDS -- BENCH_ARGS...
#   e.g. scripts/ab_bench.sh out/ab build_main/taxfree build/taxfree 2 -- flash_decode -g 2 -c 1 \
#          --shape batch=1,kv=8192,heads=96/12
#
# Writes OUT_DIR/{A,B}<round>.{json,log}. Exit code: the number of bench runs that failed (a wrong
# element fails its run).
set -u -o pipefail
out=${1:?usage: scripts/ab_bench.sh OUT_DIR BIN_A BIN_B ROUNDS -- BENCH_ARGS...}
bin_a=${2:?BIN_A}
bin_b=${3:?BIN_B}
rounds=${4:?ROUNDS}
shift 4
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
sections=""
. "$(dirname "$0")/sweep_env.sh"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
  for x in $order; do
    bin=$bin_a
    [ "$x" = B ] && bin=$bin_b
    t0=$SECONDS
    timeout -k 10 560 "$bin" bench "$@" --json "$out/$x$r.json" >"$out/$x$r.log" 2>&1
    rc=$?
    echo "=== $x$r ($bin): exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
done
python3 "$(dirname "$0")/ab_compare.py" "$out"/A*.json -- "$out"/B*.json
exit $failed
