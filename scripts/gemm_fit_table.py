#!/usr/bin/env python3
"""Re-timing the GEMM fit tables (tests/data/gemm_*.csv, tests/cpu/gemm_heuristic_fit_test.cc).

    scripts/gemm_fit_table.py shapes TABLE.csv...                # "M N K layout" lines, each shape once
    scripts/gemm_fit_table.py entries TABLE.csv... [--old-kernel] [--choices LISTING]
    scripts/gemm_fit_table.py rows LISTING RESULT.json...        # fit-table rows of a bench run

`entries` prints `--shape` entries forcing the tables' configs (each (shape, config) once, raster
group included) for `build/taxfree bench gemm -g 1 --variant ours ...`. --old-kernel keeps only the
rows that timed the kernel before the overlapped last m-block (single-CTA configs whose last
m-block is partial: the fit test's timed_another_kernel); --choices adds the config a
`taxfree gemm-choice` listing names for each of the tables' shapes. `rows` turns the bench JSONs of
such entries into table rows "m,n,k,layout,config,time_us,0,heur", one per timed case and JSON
(heur 1 where the config is the listing's choice for its shape); any case with wrong elements
stops it. A round trip, on a GPU:

    scripts/gemm_fit_table.py shapes T.csv | build/taxfree gemm-choice --stdin > CHOICES.txt
    scripts/gemm_fit_table.py entries T.csv --old-kernel --choices CHOICES.txt > E.txt
    build/taxfree bench gemm -g 1 --variant ours $(cat E.txt) --json R.json
    scripts/gemm_fit_table.py rows CHOICES.txt R.json >> NEW_TABLE.csv
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_choice_ab import entry, read_listing  # noqa: E402

HEADER = "m,n,k,layout,config,time_us,cublaslt_us,heur"


def read_table(path):
    """[(shape, config)] of a fit table, shape = (M, N, K, layout) as strings."""
    rows, header = [], False
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not header:
                if line != HEADER:
                    sys.exit(f"{path}:{number}: expected the header {HEADER}")
                header = True
                continue
            fields = line.split(",")
            if len(fields) != 8:
                sys.exit(f"{path}:{number}: expected 8 fields: {line}")
            rows.append((tuple(fields[:4]), fields[4]))
    return rows


def timed_old_kernel(shape, config):
    """The fit test's timed_another_kernel: a single CTA over a partial last m-block."""
    m, bm = int(shape[0]), int(config.split("x")[0])
    return m > bm and m % bm != 0 and not re.search(r" c[2-9]", config)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("shapes", "entries", "rows"):
        sys.exit(__doc__)
    if argv[1] == "rows":
        choices = read_listing(argv[2])
        for path in argv[3:]:
            with open(path) as f:
                results = json.load(f)["results"]
            for r in results:
                p = r["params"]
                if r.get("nwrong", 0) > 0:
                    sys.exit(f"{path}: {r['case']} has {r['nwrong']} wrong elements")
                shape = (str(p["m"]), str(p["n"]), str(p["k"]), p["layout"])
                heur = int(choices.get(shape) == p["config"])
                print(f"{','.join(shape)},{p['config']},{r['time_us']['median']:.2f},0,{heur}")
        return
    args, old_kernel, listing = argv[2:], False, None
    if "--old-kernel" in args:
        args.remove("--old-kernel")
        old_kernel = True
    if "--choices" in args:
        i = args.index("--choices")
        if i + 1 >= len(args):
            sys.exit("--choices needs a gemm-choice listing")
        listing = read_listing(args[i + 1])
        del args[i:i + 2]
    if not args or (argv[1] == "shapes" and (old_kernel or listing)):
        sys.exit(__doc__)
    rows = [row for path in args for row in read_table(path)]
    shapes = list(dict.fromkeys(shape for shape, _ in rows))
    if argv[1] == "shapes":
        print("\n".join(" ".join(s) for s in shapes))
        return
    forced = [(s, c) for s, c in rows if not old_kernel or timed_old_kernel(s, c)]
    if listing is not None:
        missing = [s for s in shapes if s not in listing]
        if missing:
            sys.exit(f"the listing has no choice for {len(missing)} of the tables' shapes, e.g. {' '.join(missing[0])}")
        forced += [(s, listing[s]) for s in shapes]
    forced = list(dict.fromkeys(forced))
    print(f"{len(forced)} entries over {len(shapes)} shapes", file=sys.stderr)
    print(" ".join(f"--shape {entry(s, c)}" for s, c in forced))


if __name__ == "__main__":
    main(sys.argv)
