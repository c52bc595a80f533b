#!/usr/bin/env python3
"""scripts/agmm_compare.py on fabricated bench and PyTorch JSONs: speedups over the faster BSP,
the issue's targets reported when missed, wrong elements flagged, and a missing PyTorch file
giving ours alone instead of a traceback."""
import unittest

from script_run import File, run_script


def ours(rows):
    """rows: (M, N, K, gather_dim, variant, median_us, nwrong)"""
    return {"results": [{"op": "all_gather_matmul", "variant": v, "time_us": {"median": t}, "nwrong": w,
                         "params": {"M": m, "N": n, "K": k, "gather_dim": gd, "layout": "kn"}, "floor_us": 10.0}
                        for m, n, k, gd, v, t, w in rows], "summary": []}


def torch(rows):
    return {"results": [{"M": m, "N": n, "K": k, "gather_dim": gd, "layout": "kn", "variant": v,
                         "time_us": {"median": t}} for m, n, k, gd, v, t in rows]}


class AgmmCompare(unittest.TestCase):
    def run_compare(self, our_doc, torch_doc):
        return run_script("agmm_compare.py", File("agmm.json", our_doc), File("torch_agmm.json", torch_doc)).stdout

    def test_targets_wrong_elements_and_torch(self):
        out = self.run_compare(
            ours([(64, 3584, 8192, 1, "bsp", 40.0, 0), (64, 3584, 8192, 1, "bsp-sym", 30.0, 0),
                  (64, 3584, 8192, 1, "auto", 25.0, 0), (64, 3584, 8192, 1, "ksplit", 25.0, 2),
                  (8192, 4096, 8192, 0, "bsp", 1000.0, 0), (8192, 4096, 8192, 0, "auto", 700.0, 0),
                  (8192, 4096, 8192, 0, "gemm-only", 690.0, 0)]),
            torch([(64, 3584, 8192, 1, "torch-fused", 20.0), (8192, 4096, 8192, 0, "torch-fused", 900.0)]))
        small = next(line for line in out.splitlines() if line.startswith("M=64 N=3584"))
        self.assertIn("1.20x", small)  # over bsp-sym, the faster BSP
        self.assertIn("WRONG 2", small)
        self.assertIn("auto 1.20x bsp (< 1.5x at M <= 1024)", out)
        self.assertIn("auto not faster than PyTorch's fused op (25.0 vs 20.0 us)", out)
        self.assertIn("# targets missed: 2", out)  # M = 8192: 1.43x bsp, 1.01x the GEMM, faster than torch
        self.assertIn("gd1 M=64     N=3584  kn: ksplit", out)  # the fastest timed variant, not auto

    def test_missing_torch_json_gives_ours_alone(self):
        out = self.run_compare(ours([(64, 3584, 8192, 1, "bsp", 40.0, 0), (64, 3584, 8192, 1, "auto", 20.0, 0)]), None)
        self.assertIn("is missing (the PyTorch step wrote no JSON): ours only", out)
        self.assertIn("# targets missed: 0", out)


if __name__ == "__main__":
    unittest.main()
