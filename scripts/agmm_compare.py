#!/usr/bin/env python3
"""all_gather_matmul results side by side: `taxfree bench all_gather_matmul --json OURS.json` and
`scripts/torch_fused_agmm.py --json TORCH.json` (same device call), with the issue's targets checked
and the fastest variant per shape, which is what `auto`'s rules (choose_agmm_variant in
src/ops/all_gather_matmul/agmm_host.cc) should say.

    scripts/agmm_compare.py OURS.json [TORCH.json]

Times are the slowest rank's median per run, in us; speedups are over BSP = the faster of bsp and
bsp-sym; tax-* are the three taxes of the BSP baseline (DESIGN.md) in us. Exit code 0 always (a
report, not a gate).
"""
import json
import os
import sys

FUSED = ("bsp-own", "decomposed", "pull", "push", "sm-specialized", "fused-ce", "ksplit", "nsplit")


def key(params):
    return (int(params["M"]), int(params["N"]), int(params["K"]), int(params["gather_dim"]), params["layout"])


def load_ours(path):
    with open(path) as f:
        doc = json.load(f)
    cases = {}
    for r in doc["results"]:
        if r.get("op") != "all_gather_matmul":
            continue
        c = cases.setdefault(key(r["params"]), {"floor": r.get("floor_us", 0), "wrong": 0})
        c[r["variant"]] = r["time_us"]["median"]
        if r.get("nwrong", -1) > 0:
            c["wrong"] += r["nwrong"]
    taxes = {}
    for s in doc.get("summary", []):
        if s.get("op") == "all_gather_matmul":
            taxes[s["case"]] = s
    return cases, taxes


def load_torch(path):
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for r in doc["results"]:
        k = (r["M"], r["N"], r["K"], r["gather_dim"], r["layout"])
        out.setdefault(k, {})[r["variant"]] = r["time_us"]["median"] if "time_us" in r else None
    return out


def fmt(x, w=9, p=1):
    return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) and x == x and x > 0 else f"{'-':>{w}}"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if not os.path.exists(sys.argv[1]):
        sys.exit(f"agmm_compare: {sys.argv[1]} is missing (the all_gather_matmul bench wrote no JSON)")
    ours, taxes = load_ours(sys.argv[1])
    torch = {}
    if len(sys.argv) > 2:
        if os.path.exists(sys.argv[2]):
            torch = load_torch(sys.argv[2])
        else:
            print(f"# {sys.argv[2]} is missing (the PyTorch step wrote no JSON): ours only\n")
    print(f"{'case':<32} {'bsp':>9} {'bsp-own':>9} {'decomp':>9} {'push':>9} {'fusedce':>9} {'ksplit':>9} {'auto':>9} {'gemm':>9} "
          f"{'floor':>9} {'auto/bsp':>8} {'t-bsp':>9} {'t-fused':>9} {'auto/tf':>8} {'tax-bsp':>8} {'tax-loc':>8} "
          f"{'tax-lau':>8}  best")
    fails, best_by = [], {}
    for k in sorted(ours, key=lambda k: (k[3], k[4], k[1], k[0])):
        c = ours[k]
        m, n, kk, gd, layout = k
        bsp = min(v for v in (c.get("bsp"), c.get("bsp-sym")) if v) if (c.get("bsp") or c.get("bsp-sym")) else None
        auto = c.get("auto")
        t = torch.get(k, {})
        tf = [v for v in (t.get("torch-fused"), t.get("torch-fused-native")) if v]
        tf = min(tf) if tf else None
        timed = {v: c[v] for v in ("bsp", "bsp-sym") + FUSED if c.get(v)}
        best = min(timed, key=timed.get) if timed else "-"
        best_by[k] = best
        label = f"M={m} N={n} K={kk} gd{gd} {layout}"
        tx = taxes.get(label, {})
        sp = bsp / auto if bsp and auto else None
        print(f"{label:<32} {fmt(bsp)} {fmt(c.get('bsp-own'))} {fmt(c.get('decomposed'))} {fmt(c.get('push'))} "
              f"{fmt(c.get('fused-ce'))} {fmt(c.get('ksplit'))} {fmt(auto)} {fmt(c.get('gemm-only'))} {fmt(c.get('floor'))} {fmt(sp, 7, 2)}x "
              f"{fmt(t.get('torch-bsp'))} {fmt(tf)} {fmt(tf / auto if tf and auto else None, 7, 2)}x "
              f"{fmt(tx.get('tax_bulk_synchronous_us'), 8)} {fmt(tx.get('tax_data_locality_us'), 8)} "
              f"{fmt(tx.get('tax_launch_us'), 8)}  {best}"
              + (f"  WRONG {c['wrong']}" if c["wrong"] else ""))
        # The issue's targets.
        if sp is not None:
            if sp < 1.0:
                fails.append(f"{label}: auto {sp:.2f}x bsp (< 1.0x)")
            if gd == 0 and m == 8192 and n == 4096 and kk == 8192 and sp < 1.3:
                fails.append(f"{label}: auto {sp:.2f}x bsp (< 1.3x)")
            if m <= 1024 and sp < 1.5:
                fails.append(f"{label}: auto {sp:.2f}x bsp (< 1.5x at M <= 1024)")
        if m >= 4096 and auto and c.get("gemm-only") and auto > 1.05 * c["gemm-only"]:
            fails.append(f"{label}: auto {auto / c['gemm-only']:.2f}x our GEMM alone (> 1.05x at M >= 4096)")
        if tf and auto and auto >= tf:
            fails.append(f"{label}: auto not faster than PyTorch's fused op ({auto:.1f} vs {tf:.1f} us)")
    print(f"\n# targets missed: {len(fails)}")
    for f in fails:
        print("  " + f)
    print("\n# fastest variant per shape (for choose_agmm_variant):")
    for k in sorted(best_by, key=lambda k: (k[3], k[0])):
        print(f"  gd{k[3]} M={k[0]:<6} N={k[1]:<5} {k[4]}: {best_by[k]}")


if __name__ == "__main__":
    main()
