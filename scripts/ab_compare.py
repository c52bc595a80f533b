#!/usr/bin/env python3
"""Compare bench JSONs of two builds, round by round.

    scripts/ab_compare.py A1.json A2.json ... -- B1.json B2.json ...

One line per (op, case, variant) present in both: A's and B's medians (us) over their rounds as
min-max, and B / A of the means of those medians (< 1: B is faster). Rows whose wrong-element count
is non-zero in any run are marked WRONG.
"""
import json
import sys
from collections import OrderedDict


def load(paths):
    """{(op, case, variant): ([median per run], wrong in any run)} in first-seen order."""
    rows = OrderedDict()
    for p in paths:
        for r in json.load(open(p))["results"]:
            key = (r["op"], r["case"], r["variant"])
            med, wrong = rows.get(key, ([], False))
            med.append(r["time_us"]["median"])
            rows[key] = (med, wrong or r.get("nwrong", 0) > 0)
    return rows


def compare(a_paths, b_paths):
    a, b = load(a_paths), load(b_paths)
    lines = [f"{'op':14s} {'case':40s} {'variant':16s} {'A us':>17s} {'B us':>17s} {'B/A':>6s}"]
    for key, (am, aw) in a.items():
        if key not in b:
            continue
        bm, bw = b[key]
        ratio = (sum(bm) / len(bm)) / (sum(am) / len(am)) if sum(am) > 0 else float("nan")
        span = lambda m: f"{f'{min(m):.2f}-{max(m):.2f}':>17s}"
        flag = "  WRONG" if aw or bw else ""
        lines.append(f"{key[0]:14s} {key[1][:40]:40s} {key[2]:16s} {span(am)} {span(bm)} {ratio:6.3f}{flag}")
    return lines


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    i = argv.index("--")
    print("\n".join(compare(argv[:i], argv[i + 1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
