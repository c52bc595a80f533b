#!/usr/bin/env bash
# Runs, on a GPU machine, the GPU tests, the fault-path checks and the benchmarks in one go, and
# writes logs and JSON into the folder it is given. Binaries come from ./build (build them first:
# scripts/setup.sh, or carry a build made elsewhere).
#
#   scripts/gpu_check.sh OUT_DIR [tests|soak|random|sanitize|faults|bench|all|agmm|graph]...     (default: all)
#
# BENCH_OPS="op ..." limits the bench step to those ops (default: every op, with the summary);
# soak (only when named): the GPU tests in SOAK_REPEATS (3) shuffled orders (seed SOAK_SEED, 1901),
# no retries: a test that depends on another's order or on state left behind, or fails now and then
# (~155 s per order at one rank).
# random (only when named): the random-shape tests in RANDOM_REPEATS (10) rounds of fresh seeds.
# sanitize (only when named): compute-sanitizer's four tools over the one-rank tests, ~8 min on an H100;
# SANITIZE_TOOLS limits it to some of memcheck, racecheck, synccheck, initcheck (default: all four),
# so the step fits calls of 10 minutes: memcheck in one, the other three in another.
# TESTS_FILTER limits the GPU tests (gtest filter syntax); TESTS_LIMIT is their time limit in s (400).
# When they fail, the tests after the first failure run once more (NO_RETRY set to anything: not).
# graph (only when named): BENCH_OPS (default: flash_decode and all_gather_matmul, their default
# sweeps) again with --graph: every variant a replayed CUDA graph, as a serving engine runs a step.
# agmm (only when named): all_gather_matmul against PyTorch's fused op in one call -- our bench,
# scripts/torch_fused_agmm.py on the same shapes, and scripts/agmm_compare.py over both JSONs, on
# GPUS ranks (default: every visible GPU, as the tests and the bench step use). The fault checks
# run on 2 ranks (the two usage-error checks ask for 64 and 1).
# TAXFREE_COMMIT: the commit env.log names (default: git rev-parse HEAD; a carried build has no .git).
#
# Exit code: 0 if every step passed, else the number of failed commands and fault checks (a retry
# that fails counts again; agmm_compare.py's verdict is printed, not counted).
set -u -o pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [tests|soak|random|sanitize|faults|bench|all|agmm|graph]...}
shift
steps=${*:-all}
# Checked before any step runs, so a bad value costs no device time.
tools=" ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck} "
for t in $tools; do
  [[ " memcheck racecheck synccheck initcheck " == *" $t "* ]] || { echo "SANITIZE_TOOLS: unknown tool '$t'" >&2; exit 2; }
done
mkdir -p "$out"
out=$(CDPATH='' cd -- "$out" && pwd) || exit 1  # absolute: the script works from the repository root
cd "$(dirname "$0")/.." || exit 1
bin=build/taxfree
tests=build/tests/taxfree_gpu_tests

# Multicast (NVLS) must stay off on shared machines.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Load the NCCL the binaries were compiled against (2.28.9 ships in PyTorch's packages there;
# /usr/lib may hold another version, which the Team refuses at start).
if nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); then
  export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done

failed=0
step() {  # step NAME LOG SECONDS COMMAND...: run with a time limit, log, count failures
  local name=$1 log=$2 limit=$3; shift 3
  echo "=== $name: $*" | tee -a "$out/$log"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >>"$out/$log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/$log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  return $rc
}

# expect_failure NAME PATTERN MAX_SECONDS COMMAND...: the command must fail (non-zero), print
# PATTERN, and end within MAX_SECONDS.
expect_failure() {
  local name=$1 pattern=$2 max=$3; shift 3
  local t0=$SECONDS
  echo "=== fault $name: $*" >>"$out/faults.log"
  timeout $((max + 30)) "$@" >"$out/fault.tmp" 2>&1
  local rc=$? took=$((SECONDS - t0))
  cat "$out/fault.tmp" >>"$out/faults.log"
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$pattern" "$out/fault.tmp" && [ $took -le "$max" ]; then
    echo "=== fault $name: OK (exit $rc, ${took} s)" | tee -a "$out/faults.log"
  else
    echo "=== fault $name: FAILED (exit $rc, ${took} s, pattern '$pattern')" | tee -a "$out/faults.log"
    failed=$((failed + 1))
  fi
  rm -f "$out/fault.tmp"
}

want() { [[ " $steps " == *" all "* || " $steps " == *" $1 "* ]]; }

{
  date -u; echo "commit ${TAXFREE_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; nvidia-smi; nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,uuid,clocks.max.sm,power.limit --format=csv  # which physical GPUs ran
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; env | grep -E '^(NCCL|NVSHMEM|TORCH_SYMM|CUDA)' | sort
  "$bin" info
} >"$out/env.log" 2>&1
tail -3 "$out/env.log"

if want tests; then
  step "gpu tests" gpu_tests.log "${TESTS_LIMIT:-400}" "$tests" --gtest_output=json:"$out/gpu_tests.json" --gtest_filter="${TESTS_FILTER:-*}"
  rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED TEST' "$out/gpu_tests.log" | tail -20
  # One failure can stop every rank (a wait that gives up ends the job): run the tests it took
  # with it once more, so the run still says how each of them fares (scripts/gtest_retry.py).
  if [ $rc -ne 0 ] && [ -z "${NO_RETRY:-}" ]; then
    "$tests" --gtest_list_tests --gtest_filter="${TESTS_FILTER:-*}" >"$out/gpu_tests.list" 2>/dev/null
    retry=$(python3 scripts/gtest_retry.py "$out/gpu_tests.log" "$out/gpu_tests.list")
    if [ -n "$retry" ]; then
      step "gpu tests after the first failure, again" gpu_tests_retry.log "${TESTS_LIMIT:-400}" "$tests" \
        --gtest_output=json:"$out/gpu_tests_retry.json" --gtest_filter="$retry"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED TEST' "$out/gpu_tests_retry.log" | tail -20
    fi
  fi
  # AgmmSim (ranks simulated on one GPU) needs eager module loading and a hardware queue per stream
  # (see its file), so the run above skipped it: one process, every kernel loaded at start.
  if [[ "${TESTS_FILTER:-*}" == "*" || ( "${TESTS_FILTER:-}" == *AgmmSim* && "${TESTS_FILTER:-}" != *-AgmmSim* ) ]]; then
    step "gpu tests AgmmSim, eager loading" gpu_tests_eager.log "${TESTS_LIMIT:-400}" \
      env CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 TAXFREE_TEST_RANKS=1 \
      "$tests" --gtest_output=json:"$out/gpu_tests_eager.json" --gtest_filter='AgmmSim.*'
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED TEST' "$out/gpu_tests_eager.log" | tail -8
  fi
fi

if [[ " $steps " == *" soak "* ]]; then  # only when named
  repeats=${SOAK_REPEATS:-3}
  step "gpu tests shuffled x$repeats" soak.log $((200 * repeats)) "$tests" --gtest_shuffle --gtest_repeat="$repeats" \
    --gtest_random_seed="${SOAK_SEED:-1901}" --gtest_filter="${TESTS_FILTER:-*}"
  grep -E '^\[  (PASSED|FAILED) |^Note: Randomizing' "$out/soak.log" | sort | uniq -c
fi

if [[ " $steps " == *" random "* ]]; then  # only when named: ~5 s a round at one rank
  # The tests that draw fresh shapes every run (README), RANDOM_REPEATS rounds, each with a new seed
  # (named in any failure; TAXFREE_TEST_SEED=N repeats one), no retries. Eager loading and a
  # hardware queue per stream for AgmmSim's (see its file).
  rounds=${RANDOM_REPEATS:-10}
  step "random-shape tests x$rounds" random.log $((60 + 30 * rounds)) \
    env CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 TAXFREE_TEST_RANKS=1 "$tests" --gtest_repeat="$rounds" \
    --gtest_filter='*RandomShapes*:*RandomSizes*'
  grep -E '^\[  (PASSED|FAILED) ' "$out/random.log" | sort | uniq -c
  grep -A3 ': Failure$' "$out/random.log" | grep -oE '\(seed [0-9]+, shape [0-9]+\)' | sort | uniq -c | head  # to repeat
fi

if [[ " $steps " == *" sanitize "* ]]; then  # only when named: ~8 minutes on an H100
  # compute-sanitizer at one rank (the tool follows the launcher's child). memcheck: every test one
  # rank runs (every op at world 1; the cross-rank tests skip). racecheck and synccheck: the decode
  # merges, the GEMM engine's schedules (tiles, splits, swap-AB, 2-CTA clusters, hooks), every
  # all_gather_matmul variant at both gather dims, all_gather's protocols and the fused decode
  # kernel's two schedules (r87 found remote shared-memory stores before their CTA ran, r89 an
  # unsynchronised flag in all_gather direct), the overlapped last m-block under every tile (M = 300)
  # and the 192-row swap-AB tile over a partial m-block (M = 200). initcheck: small decode and GEMM
  # tests. Eager loading and 32 hardware queues, as for AgmmSim: with the default 8, the graph
  # replays of 8 simulated ranks waited out their deadline under memcheck (r351: 0 memcheck errors;
  # with 32, r352: passed, 0 errors). AgmmSim's graph replay runs under memcheck apart (its other
  # tests are slow there).
  heavy='Shapes/AgmmEveryVariant.*gd1_bf16_kn:Shapes/AgmmEveryVariant.*gd0_bf16_nk:Agmm.PushWithTinyPiecesOneCtaAndDecodeShapes:Types/AgmmKsplit.*bf16_nk_ksplit:AllGather.EveryVariantOddSizesGuardsAndInPlace:FlashDecodeDist.ClusterSplitMergeMatchesGlobalMergeBitwise:FlashDecodeDist.ForcedSplitCountsAndPersistentGrid:FlashDecodeDist.SmallBatchAutoPlanFusedMatchesBspBitwise:FlashDecodeGpu.ForcedSplitCounts:FlashDecodeGpu.PagedMatchesContiguousBitwise:FlashDecodeGpu.SimulatedRanksOddSlices:Shapes/GemmAllConfigs.MatchesReference/M127_N3590_K1001_bf16_nk:Shapes/GemmSplit.*M127_N3590_K1001_nk:Shapes/GemmSwap.*M7_N1000_K8200_bf16_nk:Shapes/GemmSplit.*M300_N1000_K100_nk:Shapes/GemmSwap.*M200_N3592_K72_bf16_nk:GemmHooks.*:GemmSplit.StreamKAddsEachElementOnce'
  small='FlashDecodeGpu.EmptyEverywhere:FlashDecodeGpu.PeakedSoftmaxAndCustomScale:FlashDecodeGpu.SimulatedRanksHeadDim64OddRows:Shapes/GemmSwap.*M33_N1000_K72_bf16_nk:Shapes/GemmSplit.*M300_N1000_K100_nk:GemmHooks.StoreIntoASecondBuffer:GemmSwapHooks.AddIntoASecondBuffer'
  sanitize() {  # TOOL LIMIT FILTER
    [[ $tools == *" $1 "* ]] || return 0
    step "compute-sanitizer $1" sanitize.log "$2" \
      env CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 TAXFREE_TEST_RANKS=1 \
      compute-sanitizer --tool "$1" --target-processes all --report-api-errors no --error-exitcode 97 "$tests" --gtest_filter="$3"
  }
  sanitize memcheck 400 '*:-AgmmSim.*'
  sanitize memcheck 200 'AgmmSim.GraphReplayAtTwoThreeAndEightRanks'
  sanitize racecheck 480 "$heavy"
  sanitize synccheck 200 "$heavy"
  sanitize initcheck 150 "$small"
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|=== compute' "$out/sanitize.log"
fi

if want faults; then
  expect_failure "peer never signals" "gave up waiting at 'all_gather: peer shard arrived' for rank 1" 40 \
    "$bin" bench all_gather -g 2 -b 64K -e 64K -n 2 -w 0 --variant push --inject skip-signal:1 --timeout 3
  expect_failure "flash_decode peer never signals" "gave up waiting at 'flash_decode: peer partial arrived' for rank 1" 40 \
    "$bin" bench flash_decode -g 2 --shape batch=1,kv=8192,heads=96/12 -n 2 -w 0 --variant fused \
    --inject skip-signal:1 --timeout 3
  expect_failure "all_gather_matmul ksplit peer never signals" \
    "gave up waiting at 'all_gather_matmul ksplit: peer partial arrived' for rank 1" 60 \
    "$bin" bench all_gather_matmul -g 2 --shape M=4,N=3584,K=8192,gather_dim=1,layout=kn -n 2 -w 0 \
    --variant ksplit --inject skip-signal:1 --timeout 3
  expect_failure "all_gather_matmul ksplit two-kernel peer never signals" \
    "gave up waiting at 'all_gather_matmul ksplit: peer partial arrived' for rank 1" 60 \
    "$bin" bench all_gather_matmul -g 2 --shape M=200,N=3584,K=8192,gather_dim=1,layout=kn -n 2 -w 0 \
    --variant ksplit --inject skip-signal:1 --timeout 3
  expect_failure "all_gather_matmul nsplit peer never signals" \
    "gave up waiting at 'all_gather_matmul nsplit: peer C block arrived' for rank 1" 60 \
    "$bin" bench all_gather_matmul -g 2 --shape M=256,N=3584,K=8192,gather_dim=1,layout=kn -n 2 -w 0 \
    --variant nsplit --inject skip-signal:1 --timeout 3
  expect_failure "all_gather_matmul sm-specialized peer never signals" \
    "gave up waiting at 'gemm: A tile ready' for rank 1" 60 \
    "$bin" bench all_gather_matmul -g 2 --shape M=256,N=3584,K=8192,gather_dim=1,layout=kn -n 2 -w 0 \
    --variant sm-specialized --inject skip-signal:1 --timeout 3
  expect_failure "rank killed mid-run" "rank 1 (pid [0-9]*) was killed by signal 9" 30 \
    "$bin" bench all_gather -g 2 -b 1M -e 1M --inject kill:1
  expect_failure "too many GPUs asked" "more GPUs than" 10 "$bin" bench all_gather -g 64
  expect_failure "one rank for a 2-rank op" "needs at least 2" 10 "$bin" bench all_gather -g 1
fi

if want bench; then
  # The README's main job: every op's default sweep and the summary.
  # shellcheck disable=SC2086
  step "taxfree bench" bench.log 480 "$bin" bench ${BENCH_OPS:-} --json "$out/bench.json"
  grep -A40 '# summary' "$out/bench.log" | head -60
fi

if [[ " $steps " == *" graph "* ]]; then
  # shellcheck disable=SC2086
  step "taxfree bench --graph" graph.log 480 "$bin" bench ${BENCH_OPS:-flash_decode all_gather_matmul} --graph \
    --json "$out/graph.json"
fi

if [[ " $steps " == *" agmm "* ]]; then
  gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  [ "$gpus" -ge 1 ] || gpus=2  # nvidia-smi missing: two ranks, the comparison's point
  step "all_gather_matmul bench" agmm.log 420 "$bin" bench all_gather_matmul -g "$gpus" --json "$out/agmm.json"
  step "PyTorch fused_all_gather_matmul" torch_agmm.log 420 python3 scripts/torch_fused_agmm.py --nproc "$gpus" \
    --json "$out/torch_agmm.json"
  python3 scripts/agmm_compare.py "$out/agmm.json" "$out/torch_agmm.json" | tee "$out/agmm_compare.txt"
fi

echo "failed steps: $failed"
exit $failed
