#!/usr/bin/env python3
"""scripts/ab_compare.py on bench JSONs of two builds: per-row spans over rounds, the B/A ratio of
the means, rows only one side has left out, wrong elements flagged."""
import unittest

from script_run import File, run_script


def bench(rows):
    return {"results": [{"op": "flash_decode", "case": c, "variant": v, "time_us": {"median": t}, "nwrong": w}
                        for c, v, t, w in rows]}


class AbCompare(unittest.TestCase):
    def run_compare(self, a_runs, b_runs):
        a = [File(f"A{i}.json", x) for i, x in enumerate(a_runs)]
        b = [File(f"B{i}.json", x) for i, x in enumerate(b_runs)]
        out = run_script("ab_compare.py", *a, "--", *b).stdout
        return {tuple(line.split()[1:3]): line.split() for line in out.splitlines()[1:]}

    def test_ratio_spans_and_flags(self):
        a = [bench([("b=1", "fused", 27.0, 0), ("b=1", "bsp", 34.0, 0), ("b=4", "fused", 60.0, 0)]),
             bench([("b=1", "fused", 26.0, 0), ("b=1", "bsp", 34.0, 0), ("b=4", "fused", 62.0, 0)])]
        b = [bench([("b=1", "fused", 25.0, 0), ("b=1", "bsp", 34.0, 3)]),
             bench([("b=1", "fused", 25.0, 0), ("b=1", "bsp", 34.0, 0)])]
        rows = self.run_compare(a, b)
        fused = rows[("b=1", "fused")]
        self.assertEqual(fused[3:5], ["26.00-27.00", "25.00-25.00"])  # A's and B's medians over rounds
        self.assertAlmostEqual(float(fused[5]), 25.0 / 26.5, places=3)
        self.assertEqual(rows[("b=1", "bsp")][-1], "WRONG")
        self.assertNotIn(("b=4", "fused"), rows)  # B never ran it

    def test_usage_without_separator(self):
        r = run_script("ab_compare.py", "x.json", check=False)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
