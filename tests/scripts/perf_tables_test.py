#!/usr/bin/env python3
"""scripts/perf_tables.py on a small bench JSON: the variant table's speedup and floor ratio, what a
one-rank run leaves out, and --taxes' three-tax rows ('-' where a tax does not apply)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "perf_tables.py")

BENCH = {
    "config": {"ranks": 2}, "device": "NVIDIA H200", "nccl_version": 22809,
    "rates": {"hbm_gbs": 4200.0, "nvlink_ce_gbs": 390.0, "flag_latency_us": 1.0, "launch_us": 3.5,
              "graph_launch_us": 0.5},
    "results": [
        {"op": "flash_decode", "case": "b=1", "size": 100, "variant": "bsp", "time_us": {"median": 34.0}, "algbw_gbs": 1.0},
        {"op": "flash_decode", "case": "b=1", "size": 100, "variant": "fused", "time_us": {"median": 27.0}, "algbw_gbs": 2.0},
    ],
    "summary": [
        {"op": "flash_decode", "case": "b=1", "size": 100, "baseline": "bsp", "baseline_us": 34.0, "best": "fused",
         "best_us": 27.0, "speedup": 34.0 / 27.0, "floor_us": 13.5, "tax_bulk_synchronous_us": 11.0,
         "tax_data_locality_us": 0.05, "tax_launch_us": -1.0},
    ],
}


def run(*args, bench=BENCH):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(bench, f)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name, *args], check=True, capture_output=True,
                              text=True).stdout
    finally:
        os.unlink(f.name)


def rows(text):
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| case")]


class PerfTables(unittest.TestCase):
    def test_variant_table(self):
        (r,) = rows(run())
        self.assertEqual(r[0], "b=1")
        self.assertEqual(r[2:6], ["34.00", "1.0", "27.00", "2.0"])
        self.assertEqual(r[6], "1.26x (fused)")
        self.assertEqual(r[7], "2.00")  # best / floor = 27 / 13.5

    def test_all_gather_matmul_gives_the_best_variants_figure_once(self):
        agmm = json.loads(json.dumps(BENCH))
        agmm["results"] = [
            {"op": "all_gather_matmul", "case": "M=8", "size": 64, "variant": v, "time_us": {"median": t},
             "tflops": f} for v, t, f in (("bsp", 30.0, 10.0), ("push", 20.0, 15.0), ("auto", 21.0, 14.3))]
        agmm["summary"] = [{"op": "all_gather_matmul", "case": "M=8", "size": 64, "baseline": "bsp",
                            "baseline_us": 30.0, "best": "push", "best_us": 20.0, "speedup": 1.5, "floor_us": 10.0}]
        out = run(bench=agmm)
        self.assertIn("| auto us | best vs BSP | best TFLOP/s | best / floor |", out)
        (r,) = rows(out)
        self.assertEqual(r[2:], ["30.00", "20.00", "21.00", "1.50x (push)", "15.0", "2.00"])

    def test_one_rank_leaves_out_what_timed_nothing(self):
        one = json.loads(json.dumps(BENCH))
        one["config"]["ranks"], one["rates"]["nvlink_ce_gbs"], one["rates"]["flag_latency_us"] = 1, 0.0, 0.0
        one["results"].append({"op": "flash_decode", "case": "b=1", "size": 100, "variant": "comm-only",
                               "time_us": {"median": 0.02}, "algbw_gbs": 5e6})
        out = run(bench=one)
        self.assertNotIn("NVLink", out)
        self.assertNotIn("comm-only us", out)
        self.assertIn("Left out, timed nothing (every median < 0.1 us): comm-only.", out)
        (r,) = rows(out)
        self.assertEqual(r[2:], ["34.00", "1.0", "27.00", "2.0", "1.26x (fused)", "2.00"])
        self.assertIn("NVLink copy engine 390 GB/s", run())

    def test_graph_mode_is_named(self):
        self.assertNotIn("CUDA graph", run())
        graph = json.loads(json.dumps(BENCH))
        graph["config"]["graph"] = True
        self.assertIn("Every variant ran as a captured CUDA graph (`--graph`)", run(bench=graph))

    def test_taxes(self):
        out = run("--taxes")
        self.assertIn("three-tax", out)
        (r,) = rows(out)
        self.assertEqual(r, ["b=1", "34.00 (bsp)", "27.00 (fused)", "1.26x", "13.50", "11.00", "0.05", "-"])


if __name__ == "__main__":
    unittest.main()
