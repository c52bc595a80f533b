#!/usr/bin/env bash
# GEMM tuning sweep in one device run: our kernel under forced configs (tile, cluster, raster
# group, split-K, tail split, stream-K, swap-AB, K clusters, 224-column tiles) on the shapes that decide the heuristic, plus the default
# sweep (heuristic vs cuBLASLt) for reference. Every case is also checked against cuBLASLt (-c 1).
#
#   scripts/gemm_tune.sh OUT_DIR [default|large|waves|mid|m128|kcluster|wide|offsweep|decode|swap|smallm|all]...   (default: all)
#
# Writes OUT_DIR/tune_<run>.{json,log} (a run per section; offsweep writes offsweep_nk and
# offsweep_more, swap swap_nk and swap_kn, smallm also smallm_heuristic), OUT_DIR/summary.txt and
# OUT_DIR/tune.csv (scripts/gemm_tune_report.py: per shape, every config's time and ratio to
# cuBLASLt, best first). Binaries come from ./build.
# Exit code: the number of failed sections (a wrong element fails its section).
set -u -o pipefail
out=${1:?usage: scripts/gemm_tune.sh OUT_DIR [default|large|waves|mid|m128|kcluster|wide|offsweep|decode|swap|smallm|all]...}
shift
sections=${*:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
bin=build/taxfree

. scripts/sweep_env.sh
# run SECTION [bench args...]: one bench invocation over the collected entries, then clear them.
run() {
  local name=$1; shift
  local t0=$SECONDS
  timeout -k 10 540 "$bin" bench gemm -g 1 --json "$out/tune_$name.json" "$@" "${entries[@]}" >"$out/tune_$name.log" 2>&1
  local rc=$?
  echo "=== $name: ${#entries[@]} args, exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  entries=()
}

K=8192
if want default; then  # the issue's sweep with the heuristic's configs, against cuBLASLt
  run default
fi

if want large; then  # peak-throughput tile: clusters and raster groups
  for s in "M=8192,N=8192" "M=4096,N=14336" "M=8192,N=7168" "M=16384,N=14336"; do
    for c in 1 2; do
      for g in 4 8 16; do add "$s,K=$K,layout=nk,tile=128x256,cluster=$c,group=$g,splitk=1"; done
    done
  done
  for c in 1 2; do add "M=8192,N=8192,K=$K,layout=kn,tile=128x256,cluster=$c,splitk=1"; done
  run large --variant ours
fi

if want waves; then  # 1.7 / 3.4 waves of 128x256 tiles: whole tiles vs tail split vs stream-K
  for s in "M=2048,N=7168" "M=4096,N=3584" "M=1024,N=14336" "M=2048,N=3584" "M=4096,N=7168"; do
    for c in 1 2; do
      for k in splitk=1 streamk=1 tailsplit=2 tailsplit=3; do add "$s,K=$K,layout=nk,tile=128x256,cluster=$c,$k"; done
    done
  done
  run waves --variant ours
fi

if want mid; then  # M = 512..1024: under one or two waves
  for s in "M=512,N=3584" "M=512,N=8192" "M=512,N=14336" "M=1024,N=3584" "M=1024,N=8192"; do
    for k in splitk=1 streamk=1 splitk=2; do
      add "$s,K=$K,layout=nk,tile=128x256,cluster=2,$k"
      add "$s,K=$K,layout=nk,tile=128x128,$k"
    done
    for k in splitk=1 streamk=1; do add "$s,K=$K,layout=nk,tile=128x256,cluster=1,$k"; done
  done
  run mid --variant ours
fi

if want m128; then  # M = 128: B streaming with few row tiles
  for s in "M=128,N=3584,K=$K,layout=nk" "M=128,N=7168,K=$K,layout=nk" "M=128,N=14336,K=$K,layout=nk" \
           "M=128,N=7168,K=$K,layout=kn"; do
    for k in splitk=1 splitk=2 splitk=4 splitk=8 streamk=1; do add "$s,tile=128x128,$k"; done
    for k in splitk=2 splitk=4 streamk=1; do add "$s,tile=128x256,cluster=1,$k"; done
    for k in splitk=1 splitk=2 splitk=4; do add "$s,tile=64x64,$k"; done
    for k in splitk=2 splitk=4 streamk=1; do add "$s,swap=1,tile=64x128,$k"; done
  done
  run m128 --variant ours
fi

if want kcluster; then  # K clusters (128x128 ck2 / ck4) against split-K over the same K ranges, around one wave
  for s in "M=128,N=3584" "M=128,N=4096" "M=128,N=7168" "M=128,N=8192" "M=256,N=3584" "M=256,N=4096" \
           "M=384,N=2048" "M=512,N=2048" "M=768,N=512" "M=768,N=1024" "M=1024,N=1024" "M=2048,N=512"; do
    for k in clusterk=2 clusterk=4 splitk=1 splitk=2 splitk=4; do add "$s,K=$K,layout=nk,tile=128x128,$k"; done
  done
  for k in clusterk=2 clusterk=4 splitk=2 splitk=4; do add "M=128,N=3584,K=$K,layout=kn,tile=128x128,$k"; done
  run kcluster --variant ours
fi

if want wide; then  # 128 x 224 (B [N, K] only) against 128 x 256 on the shapes N = 3584 k tiles in whole waves
  for s in "M=256,N=14336" "M=512,N=7168" "M=512,N=14336" "M=768,N=14336" "M=1024,N=3584" "M=1024,N=7168" \
           "M=1024,N=14336" "M=2048,N=3584" "M=2048,N=7168" "M=4096,N=3584" "M=4096,N=7168"; do
    for c in 1 2; do
      for k in splitk=1 tailsplit=2; do
        add "$s,K=$K,layout=nk,tile=128x224,cluster=$c,$k"
        add "$s,K=$K,layout=nk,tile=128x256,cluster=$c,$k"
      done
    done
  done
  run wide --variant ours
fi

if want offsweep; then  # shapes off the issue's sweep x the main candidates (tests/data/gemm_offsweep_h200.csv)
  grid() {  # LAYOUT K "Ms" "Ns" CONFIGS...: the heuristic's config and each forced one per shape
    local lay=$1 k=$2 ms=$3 ns=$4; shift 4
    for m in $ms; do for n in $ns; do
      add "M=$m,N=$n,K=$k,layout=$lay"
      for c in "$@"; do add "M=$m,N=$n,K=$k,layout=$lay,$c"; done
    done; done
  }
  C=(tile=128x256,cluster=2,splitk=1 tile=128x256,cluster=2,tailsplit=2 tile=128x256,cluster=1,splitk=1 tile=128x128,splitk=1
     tile=128x128,tailsplit=2 tile=128x128,splitk=2 tile=128x128,splitk=3 tile=128x128,tailsplit=4 tile=64x64,splitk=2)
  W=(tile=128x224,cluster=2,splitk=1 tile=128x224,cluster=1,splitk=1 tile=128x224,cluster=2,tailsplit=2)
  grid nk 8192 "192 320 384 576 640 768 896 1152 1536" "1536 2560 3072 4608 6144 6656 9216 10752" "${C[@]}" "${W[@]}"
  grid nk 8192 "128 256 448 960 1280 2560" "2048 3584 5120 8192 13824 18944" "${C[@]}" "${W[@]}"
  run offsweep_nk
  grid nk 4096 "256 512 1024 2048" "3584 5120 8192 14336" "${C[@]}" "${W[@]}"
  grid kn 8192 "192 320 640 1152" "2560 3072 6144 10752" "${C[@]}"
  grid kn 8192 "448 960 2560" "5120 13824 18944" "${C[@]}"
  run offsweep_more
fi

if want decode; then  # M = 1 and 16: B-streaming floor
  for m in 1 16; do
    for n in 3584 8192 14336; do
      for k in splitk=1 splitk=2 splitk=3 splitk=4 splitk=7 streamk=1; do add "M=$m,N=$n,K=$K,layout=nk,tile=64x64,$k"; done
    done
    for n in 3584 14336; do
      for k in splitk=1 splitk=2 splitk=3 splitk=4 splitk=7 streamk=1; do add "M=$m,N=$n,K=$K,layout=kn,tile=64x64,$k"; done
    done
    for n in 3584 8192 14336; do
      for k in splitk=4 streamk=1; do add "M=$m,N=$n,K=$K,layout=nk,swap=1,tile=16x128,$k"; done
    done
  done
  run decode --variant ours
fi

if want smallm; then  # M = 1-64 on the swap-AB tiles: split-K 1-6, stream-K, K clusters; then heuristic vs cuBLASLt
  for layout in nk kn; do
    for m in 1 16 64; do
      for n in 3584 7168 14336; do
        cuts="splitk=1 splitk=2 splitk=3 splitk=4 splitk=6 streamk=1"
        [ $m -le 16 ] && cuts="$cuts clusterk=2 clusterk=4"  # the 16x128 tile's K clusters
        for k in $cuts; do add "M=$m,N=$n,K=$K,layout=$layout,swap=1,$k"; done
      done
    done
  done
  run smallm --variant ours
  for layout in nk kn; do for m in 1 16 64; do for n in 3584 7168 14336; do add "M=$m,N=$n,K=$K,layout=$layout"; done; done; done
  run smallm_heuristic
fi

if want swap; then  # swap-AB (C^T = B^T A^T): tile x split-K / stream-K vs the best plain config, vs cuBLASLt
  for layout in nk kn; do
    for m in 1 16 64 128 256; do
      for n in 3584 8192 14336; do
        tiles="64x128"
        [ $m -le 32 ] && tiles="32x128 64x128"
        [ $m -le 16 ] && tiles="16x128 32x128"
        for t in $tiles; do
          for k in splitk=1 splitk=2 splitk=4 streamk=1; do add "M=$m,N=$n,K=$K,layout=$layout,swap=1,tile=$t,$k"; done
        done
        add "M=$m,N=$n,K=$K,layout=$layout,swap=0"  # the heuristic's best without swap-AB
      done
    done
    run "swap_$layout"
  done
fi

python3 scripts/gemm_tune_report.py "$out" --csv "$out/tune.csv" >"$out/summary.txt" 2>&1 || failed=$((failed + 1))
head -c 20000 "$out/summary.txt"
echo "failed sections: $failed"
exit $failed
