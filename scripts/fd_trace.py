#!/usr/bin/env python3
"""Summarise TAXFREE_FD_TRACE files (the fused flash_decode kernel's per-CTA timeline).

    scripts/fd_trace.py [--per-cta N] [--tail] PREFIX.*.rank*.txt

Each file has one line per CTA: "cta start attended synced merged pushed arrived combined end sm" in
%globaltimer ns (0 = not reached; with persistent CTAs the last item's marks), then the SM id. Prints, per file,
each event's time after the kernel's first CTA start (min / median / max over the CTAs that
reached it, us), and how many CTAs reached it. --per-cta N: each CTA's attend time and SM, N per
line. --tail: each CTA that combined (the one that merged a group's splits, or combined its rows
across ranks), the time from each of its events to the next it reached, from `attended` on, then
those steps' min / median / max over such CTAs: where a launch's tail goes, and which CTA was late.
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


def tail_steps(rows):
    """(cta, sm, [(event, us after the previous reached event)]) of each CTA that reached `combined`,
    from `attended` on (attended's own entry: us after the kernel's first start)."""
    t0 = min(r[0] for r in rows if r[0])
    out = []
    for cta, r in enumerate(rows):
        if not r[EVENTS.index("combined")]:
            continue
        steps, prev = [], t0
        for i in range(EVENTS.index("attended"), len(EVENTS)):
            if r[i]:
                steps.append((EVENTS[i], (r[i] - prev) / 1e3))
                prev = r[i]
        out.append((cta, r[len(EVENTS)] if len(r) > len(EVENTS) else -1, steps))
    return out


def tail(rows):
    """Prints tail_steps and each step's min / median / max over the CTAs that took it."""
    by_step = collections.defaultdict(list)
    for cta, sm, steps in tail_steps(rows):
        print(f"  tail cta {cta:4d} sm {sm:3d}: " + " ".join(
            f"{e} {us:.2f}" if i == 0 else f"-> {e} +{us:.2f}" for i, (e, us) in enumerate(steps)))
        for e, us in steps[1:]:
            by_step[e].append(us)
    for e, xs in by_step.items():
        print(f"  tail step to {e:9s} n={len(xs):4d}  min {min(xs):6.2f}  median {statistics.median(xs):6.2f}  max {max(xs):6.2f} us")


if __name__ == "__main__":
    args = sys.argv[1:]
    n, show_tail = 0, False
    while args[:1] in (["--per-cta"], ["--tail"]):
        if args[0] == "--tail":
            show_tail, args = True, args[1:]
            continue
        if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            sys.exit("--per-cta needs a positive count\n" + __doc__)
        n, args = int(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    for p in args:
        rows = summarise(p)
        if n:
            per_cta(rows, n)
        if show_tail:
            tail(rows)
