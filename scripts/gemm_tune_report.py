#!/usr/bin/env python3
"""Summary of scripts/gemm_tune.sh: per shape, cuBLASLt and every config of ours, fastest first.

    scripts/gemm_tune_report.py OUT_DIR [--csv PATH]

Reads OUT_DIR/tune_*.json (taxfree bench --json). `ratio` is cuBLASLt time / ours (> 1: ours is
faster); `heur` marks the heuristic's own config (from the default section). Ends with the
geometric means the targets are stated in (M >= 2048 and M <= 1024) for the heuristic's configs
and for the best config found per shape. --csv writes every timed config as the table the CPU test
tests/cpu/gemm_heuristic_fit_test.cc checks the heuristic against (tests/data/gemm_tune_h200.csv).
"""
import glob
import json
import math
import os
import sys
from collections import defaultdict


def main():
    out = sys.argv[1]
    csv_path = sys.argv[sys.argv.index("--csv") + 1] if "--csv" in sys.argv else None
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "tune_*.json"))):
        with open(path) as f:
            doc = json.load(f)
        section = os.path.basename(path)[len("tune_"):-len(".json")]
        for r in doc.get("results", []):
            if r.get("op") == "gemm":
                r["section"] = section
                rows.append(r)
    shapes = defaultdict(list)
    for r in rows:
        p = r["params"]
        shapes[(p["m"], p["n"], p["k"], p["layout"])].append(r)

    heur_ratio, best_ratio, bad = {}, {}, 0
    csv_rows = []
    for key in sorted(shapes, key=lambda k: (k[3], k[0], k[1], k[2])):
        m, n, k, layout = key
        rs = shapes[key]
        base = [r["time_us"]["median"] for r in rs if r["variant"] == "cublaslt"]
        base_us = min(base) if base else None
        ours = sorted((r for r in rs if r["variant"] == "ours"), key=lambda r: r["time_us"]["median"])
        print(f"M={m} N={n} K={k} {layout}: cuBLASLt " + (f"{base_us:.1f} us" if base_us else "n/a"))
        for r in ours:
            t = r["time_us"]["median"]
            ratio = base_us / t if base_us else float("nan")
            heur = r["section"] == "default"
            if heur and base_us:
                heur_ratio[key] = ratio
            if base_us:
                best_ratio[key] = max(best_ratio.get(key, 0), ratio)
            if base_us:
                csv_rows.append(f"{m},{n},{k},{layout},{r['params']['config']},{t:.2f},{base_us:.2f},{int(heur)}")
            wrong = r.get("nwrong", 0)
            bad += wrong != 0 and wrong != -1
            print(f"  {t:9.1f} us {r['tflops']:7.1f} TFLOP/s  {ratio:5.2f}x  {r['params']['config']:<28}"
                  f"{' heur' if heur else ''}{'  WRONG ' + str(wrong) if wrong not in (0, -1) else ''}")

    if csv_path:
        with open(csv_path, "w") as f:
            f.write(f"# scripts/gemm_tune.sh: {out}\n# time_us: median; cublaslt_us: cuBLASLt on the same shape in the "
                    "same run; heur: the heuristic's config (section default)\n")
            f.write("m,n,k,layout,config,time_us,cublaslt_us,heur\n" + "\n".join(csv_rows) + "\n")

    def gmean(d, pred):
        v = [x for key, x in d.items() if pred(key)]
        return (math.exp(sum(math.log(x) for x in v) / len(v)), len(v)) if v else (float("nan"), 0)

    for name, pred, target in (("M >= 2048", lambda k: k[0] >= 2048, 0.95), ("M <= 1024", lambda k: k[0] <= 1024, 0.9)):
        h, nh = gmean(heur_ratio, pred)
        b, nb = gmean(best_ratio, pred)
        print(f"geomean ours/cuBLASLt {name}: heuristic {h:.3f} ({nh} shapes), best config per shape {b:.3f} "
              f"({nb} shapes); target {target}")
    key = (8192, 8192, 8192, "nk")
    best = [r for r in shapes.get(key, []) if r["variant"] == "ours"]
    if best:
        print(f"8192^3 nk best: {max(r['tflops'] for r in best):.1f} TFLOP/s (target 700)")
    if bad:
        print(f"{bad} configs had wrong elements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
