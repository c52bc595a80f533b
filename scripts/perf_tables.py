#!/usr/bin/env python3
"""Markdown tables from a `taxfree bench --json` file, one per op, for docs/PERFORMANCE.md.

    scripts/perf_tables.py bench.json [--ops all_gather,gemm] [--every N] [--taxes]

Each row is one case; each variant gets its median time (us) and the op's throughput figure
(busbw GB/s for collectives, TFLOP/s for gemm, GB/s for memory-bound kernels; all_gather_matmul,
with its many variants, shows times and one TFLOP/s column, the best variant's); the last columns
are the best non-baseline variant's speedup over the fastest baseline and time over the floor. A
variant whose every median is under 0.1 us timed nothing (flash_decode's comm-only at one rank: no
exchange) and is left out, named under its table; at one rank the NVLink rate is not printed.
--taxes: instead, per op, the bench summary's three-tax breakdown of the BSP baseline (DESIGN.md:
bulk-synchronous = BSP - max(compute-only, communication-only); data locality = intermediates'
HBM round trip at the measured rate; launch = BSP's extra kernels x the measured launch cost)
beside the baseline, the best variant and the floor.
"""
import argparse
import json
from collections import OrderedDict

FIGURE = {"all_gather": ("busbw_gbs", "busbw GB/s"), "put_get": ("algbw_gbs", "GB/s"),
          "gemm": ("tflops", "TFLOP/s"), "decode": ("algbw_gbs", "GB/s"),
          "flash_decode": ("algbw_gbs", "GB/s")}
# Ops whose table gives the figure of the best variant only (one column, not one per variant).
BEST_FIGURE = {"all_gather_matmul": ("tflops", "TFLOP/s")}
kNothingUs = 0.1  # a variant whose every median is below this timed no work


def fmt(x, digits=1):
    return "-" if x is None or x <= 0 else f"{x:.{digits}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--ops", default="")
    ap.add_argument("--every", type=int, default=1, help="keep every N-th case")
    ap.add_argument("--taxes", action="store_true", help="the three-tax breakdown per case")
    a = ap.parse_args()
    d = json.load(open(a.json))
    ops = [o for o in a.ops.split(",") if o] or list(OrderedDict.fromkeys(r["op"] for r in d["results"]))
    summary = {(s["op"], s["case"], s["size"]): s for s in d["summary"]}
    r = d["rates"]
    v = d["nccl_version"]
    lat = f", flag one-way {r['flag_latency_us']:.2f} us" if r.get("flag_latency_us") else ""
    link = f", NVLink copy engine {r['nvlink_ce_gbs']:.0f} GB/s" if r.get("nvlink_ce_gbs") else ""
    print(f"Measured in the same run: HBM copy {r['hbm_gbs']:.0f} GB/s{link}{lat}, launch {r['launch_us']:.2f} us "
          f"(graph {r['graph_launch_us']:.2f} us); "
          f"{d['config']['ranks']} ranks, {d['device']}, NCCL {v // 10000}.{v // 100 % 100}.{v % 100}."
          + (" Every variant ran as a captured CUDA graph (`--graph`); the launch tax is at the graph rate."
             if d['config'].get('graph') else "") + "\n")
    if a.taxes:
        for op in ops:
            tax_table(op, [x for x in d["summary"] if x["op"] == op][:: a.every])
        return
    for op in ops:
        rows = [x for x in d["results"] if x["op"] == op]
        if not rows:
            continue
        variants = list(OrderedDict.fromkeys(x["variant"] for x in rows))
        empty = [v for v in variants if all(x["time_us"]["median"] < kNothingUs for x in rows if x["variant"] == v)]
        variants = [v for v in variants if v not in empty]
        key, label = FIGURE.get(op, (None, None))
        cases = list(OrderedDict.fromkeys((x["case"], x["size"]) for x in rows))[:: a.every]
        head = ["case", "size (B)"]
        for v in variants:
            head += [f"{v} us"] + ([f"{v} {label}"] if key else [])
        best_key, best_label = BEST_FIGURE.get(op, (None, None))
        head += ["best vs BSP"] + ([f"best {best_label}"] if best_key else []) + ["best / floor"]
        print(f"### {op}\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for case, size in cases:
            cells = [case, str(size)]
            for v in variants:
                m = next((x for x in rows if x["case"] == case and x["size"] == size and x["variant"] == v), None)
                cells.append(fmt(m["time_us"]["median"], 2) if m else "-")
                if key:
                    cells.append(fmt(m[key]) if m else "-")
            s = summary.get((op, case, size), {})
            cells.append(f"{s['speedup']:.2f}x ({s['best']})" if s.get("speedup") else "-")
            if best_key:
                b = next((x for x in rows if x["case"] == case and x["size"] == size and x["variant"] == s.get("best")),
                         None)
                cells.append(fmt(b[best_key]) if b else "-")
            fl = s.get("floor_us", 0)
            best = s.get("best_us") or s.get("baseline_us")
            cells.append(f"{best / fl:.2f}" if fl and best else "-")
            print("| " + " | ".join(cells) + " |")
        if empty:
            print(f"\nLeft out, timed nothing (every median < {kNothingUs} us): {', '.join(empty)}.")
        print()


def tax_table(op, rows):
    """One op's three-tax table from the bench summary rows (us; '-' where a tax does not apply)."""
    if not rows:
        return
    head = ["case", "BSP us", "best us", "best vs BSP", "floor us", "bulk-synchronous tax us",
            "data-locality tax us", "launch tax us"]
    print(f"### {op}: three-tax breakdown of the BSP baseline\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in rows:
        tax = [fmt(s.get(k), 2) for k in ("tax_bulk_synchronous_us", "tax_data_locality_us", "tax_launch_us")]
        best = f"{fmt(s.get('best_us'), 2)} ({s['best']})" if s.get("best") else "-"
        speed = f"{s['speedup']:.2f}x" if s.get("speedup") else "-"
        print("| " + " | ".join([s["case"], f"{fmt(s.get('baseline_us'), 2)} ({s['baseline']})", best, speed,
                                 fmt(s.get("floor_us"), 2)] + tax) + " |")
    print()


if __name__ == "__main__":
    main()
