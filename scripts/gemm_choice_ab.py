#!/usr/bin/env python3
"""What a GEMM heuristic change moves, as bench entries that time both choices.

    build/taxfree gemm-choice --stdin < SHAPES > OLD.txt       # before the change
    build/taxfree gemm-choice --stdin < SHAPES > NEW.txt       # after it
    scripts/gemm_choice_ab.py OLD.txt NEW.txt > ENTRIES.txt    # on stderr: how many moved
    build/taxfree bench gemm -g 1 --variant ours $(cat ENTRIES.txt) --json R1.json   # on a GPU
    scripts/gemm_choice_ab.py OLD.txt NEW.txt --compare R1.json [R2.json ...]

The listings are `taxfree gemm-choice` output ("M N K layout config" a line). ENTRIES holds, for
every shape whose config differs, two `--shape` entries forcing the old config and the new one
(raster group included). With --compare, the bench JSONs of those entries (any number of rounds;
each config's time is the median of its rounds' medians) give new / old per shape and their geomean
(< 1: the change is faster), how many moved shapes no JSON timed, and any case with wrong elements
(marked WRONG).
"""
import json
import math
import re
import statistics
import sys

CONFIG = re.compile(
    r"(?P<bm>\d+)x(?P<bn>\d+)x64 s\d+ g(?P<group>\d+)(?P<swap> swap)?(?: c(?P<cluster>\d+))?(?: ck(?P<clusterk>\d+))?"
    r"(?: sk(?P<splits>\d+)(?P<tail>t)?| (?P<stream>stk))?$")


def read_listing(path):
    """{(M, N, K, layout): config} of a gemm-choice listing."""
    choices = {}
    with open(path) as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 5 or fields[3] not in ("nk", "kn"):
            sys.exit(f"{path}:{number}: not a gemm-choice line: {line}")
        choices[tuple(fields[:4])] = " ".join(fields[4:])
    return choices


def entry(shape, config):
    """The bench --shape entry that forces `config` on `shape`."""
    m = CONFIG.match(config)
    if not m:
        sys.exit(f"unrecognised config name: {config}")
    if m["stream"]:
        cut = "streamk=1"
    elif m["splits"]:
        cut = ("tailsplit=" if m["tail"] else "splitk=") + m["splits"]
    else:
        cut = "splitk=1"
    return (f"M={shape[0]},N={shape[1]},K={shape[2]},layout={shape[3]},tile={m['bm']}x{m['bn']},group={m['group']},"
            f"swap={1 if m['swap'] else 0},cluster={m['cluster'] or 1},clusterk={m['clusterk'] or 1},{cut}")


def compare(moved, old, new, paths):
    times, wrong = {}, set()
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for r in doc["results"]:
            times.setdefault(r["case"], []).append(r["time_us"]["median"])
            if r.get("nwrong", 0) > 0:
                wrong.add(r["case"])
    ratios, untimed = [], 0
    for shape in moved:
        case = f"M={shape[0]} N={shape[1]} K={shape[2]} {shape[3]} [%s]"
        a, b = times.get(case % old[shape]), times.get(case % new[shape])
        if not a or not b:
            untimed += 1
            continue
        ratio = statistics.median(b) / statistics.median(a)
        ratios.append(ratio)
        flag = "  WRONG" if {case % old[shape], case % new[shape]} & wrong else ""
        print(f"{' '.join(shape):28s} {old[shape]:32s} {statistics.median(a):9.2f}  "
              f"{new[shape]:32s} {statistics.median(b):9.2f}  {ratio:.3f}{flag}")
    if ratios:
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{len(ratios)} shapes timed: new / old geomean {geomean:.3f}, "
              f"{sum(r < 0.98 for r in ratios)} faster, {sum(r > 1.02 for r in ratios)} slower (2%), "
              f"worst {max(ratios):.3f}; {untimed} moved shapes untimed; {len(wrong)} cases with wrong elements")
    else:
        print(f"no moved shape timed ({untimed} untimed)")


def main(argv):
    if len(argv) < 3 or (len(argv) > 3 and (argv[3] != "--compare" or len(argv) == 4)):
        sys.exit(__doc__)
    old, new = read_listing(argv[1]), read_listing(argv[2])
    if old.keys() != new.keys():
        sys.exit("the two listings name different shapes")
    moved = [s for s in old if old[s] != new[s]]
    if len(argv) > 3:
        compare(moved, old, new, argv[4:])
        return
    print(f"{len(moved)} of {len(old)} shapes moved", file=sys.stderr)
    print(" ".join(f"--shape {entry(s, c)}" for s in moved for c in (old[s], new[s])))


if __name__ == "__main__":
    main(sys.argv)
