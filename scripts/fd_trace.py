#!/usr/bin/env python3
"""Summarise TAXFREE_FD_TRACE files (the fused flash_decode kernel's per-CTA timeline).

    scripts/fd_trace.py [--per-cta N] PREFIX.*.rank*.txt

Each file has one line per CTA: "cta start attended synced merged pushed arrived combined end sm" in
%globaltimer ns (0 = not reached; with persistent CTAs the last item's marks), then the SM id. Prints, per file,
each event's time after the kernel's first CTA start (min / median / max over the CTAs that
reached it, us), and how many CTAs reached it.
"""
import collections
import statistics
import sys

EVENTS = ["start", "attended", "synced", "merged", "pushed", "arrived", "combined", "end"]  # then the SM id


def summarise(path):
    rows = [list(map(int, line.split()[1:])) for line in open(path) if line.strip()]
    t0 = min(r[0] for r in rows if r[0])
    print(f"{path}: {len(rows)} CTAs")
    for i, name in enumerate(EVENTS):
        xs = [(r[i] - t0) / 1e3 for r in rows if r[i]]
        if xs:
            print(f"  {name:9s} n={len(xs):4d}  min {min(xs):7.2f}  median {statistics.median(xs):7.2f}  max {max(xs):7.2f} us")
    if all(len(r) > len(EVENTS) for r in rows):
        per_sm = collections.Counter(r[len(EVENTS)] for r in rows)
        shared = sum(1 for n in per_sm.values() if n > 1)
        print(f"  SMs used {len(per_sm)}, of them holding more than one CTA: {shared}")
    return rows


def per_cta(rows, n):
    """Attend time (us) / SM of each CTA, n per line (CTAs in launch order)."""
    for i in range(0, len(rows), n):
        print("   " + " ".join(f"{(r[1] - r[0]) / 1e3:5.1f}/{r[-1]:3d}" if r[1] else "    -/  -" for r in rows[i:i + n]))


if __name__ == "__main__":
    args = sys.argv[1:]
    n = 0
    if args[:1] == ["--per-cta"]:
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            sys.exit("--per-cta needs a positive count\n" + __doc__)
        n, args = int(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    for p in args:
        rows = summarise(p)
        if n:
            per_cta(rows, n)
