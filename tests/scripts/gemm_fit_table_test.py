#!/usr/bin/env python3
"""scripts/gemm_fit_table.py: the tables' shapes once each, entries for the rows that timed the kernel
before the overlapped last m-block plus a listing's choices, and bench JSONs back into table rows."""
import unittest

from script_run import File, run_script

TABLE = """# a comment
m,n,k,layout,config,time_us,cublaslt_us,heur
1000,3584,8192,nk,128x128x64 s6 g1,80.0,70.0,1
1000,3584,8192,nk,128x224x64 s4 g1 c2 sk2t,75.0,70.0,0
1024,3584,8192,nk,128x128x64 s6 g1,81.0,70.0,0
100,2048,4096,kn,128x128x64 s6 g1 ck2,20.0,18.0,1
200,3584,72,nk,192x128x64 s4 g1 swap sk3,5.0,4.0,0
1000,3584,8192,nk,128x128x64 s6 g1,80.5,70.0,0
"""
OTHER = """m,n,k,layout,config,time_us,cublaslt_us,heur
1000,3584,8192,nk,128x256x64 s4 g8 c2,90.0,70.0,0
300,1000,100,kn,64x64x64 s13 g1 sk2,3.0,2.0,1
"""
CHOICES = """1000 3584 8192 nk 128x168x64 s5 g8
1024 3584 8192 nk 128x128x64 s6 g1
100 2048 4096 kn 128x128x64 s6 g1 ck2
200 3584 72 nk 192x128x64 s4 g1 swap sk3
300 1000 100 kn 64x64x64 s13 g1 sk2
"""


def result(m, n, k, layout, config, us, nwrong=0):
    return {"case": f"M={m} N={n} K={k} {layout} [{config}]", "nwrong": nwrong, "time_us": {"median": us},
            "params": {"m": m, "n": n, "k": k, "layout": layout, "config": config}}


class GemmFitTable(unittest.TestCase):
    def test_shapes_once_each_in_table_order(self):
        out = run_script("gemm_fit_table.py", "shapes", File("t.csv", TABLE), File("o.csv", OTHER)).stdout
        self.assertEqual(out.splitlines(), ["1000 3584 8192 nk", "1024 3584 8192 nk", "100 2048 4096 kn",
                                            "200 3584 72 nk", "300 1000 100 kn"])

    def test_entries_of_the_old_kernel_and_the_choices(self):
        r = run_script("gemm_fit_table.py", "entries", File("t.csv", TABLE), File("o.csv", OTHER), "--old-kernel")
        # Single CTAs over a partial last m-block only: not M = 1024 (whole m-blocks), not the pair (c2),
        # not M = 100 (one m-block, below the tile), and the duplicate row once.
        self.assertEqual(r.stdout.split()[1::2], [
            "M=1000,N=3584,K=8192,layout=nk,tile=128x128,group=1,swap=0,cluster=1,clusterk=1,splitk=1",
            "M=200,N=3584,K=72,layout=nk,tile=192x128,group=1,swap=1,cluster=1,clusterk=1,splitk=3",
            "M=300,N=1000,K=100,layout=kn,tile=64x64,group=1,swap=0,cluster=1,clusterk=1,splitk=2",
        ])
        self.assertIn("3 entries over 5 shapes", r.stderr)
        r = run_script("gemm_fit_table.py", "entries", File("t.csv", TABLE), File("o.csv", OTHER), "--old-kernel",
                       "--choices", File("c.txt", CHOICES))
        entries = r.stdout.split()[1::2]
        self.assertEqual(len(entries), 6)  # the 3 above, then the 3 choices not among them
        self.assertIn("M=1000,N=3584,K=8192,layout=nk,tile=128x168,group=8,swap=0,cluster=1,clusterk=1,splitk=1",
                      entries)
        self.assertEqual(len(run_script("gemm_fit_table.py", "entries", File("t.csv", TABLE)).stdout.split()) // 2, 5)

    def test_rows_mark_the_choice_and_refuse_wrong_elements(self):
        runs = [{"results": [result(1000, 3584, 8192, "nk", "128x168x64 s5 g8", 70.123),
                             result(1000, 3584, 8192, "nk", "128x128x64 s6 g1", 80.0)]},
                {"results": [result(300, 1000, 100, "kn", "64x64x64 s13 g1 sk2", 2.5)]}]
        out = run_script("gemm_fit_table.py", "rows", File("c.txt", CHOICES), File("a.json", runs[0]),
                         File("b.json", runs[1])).stdout
        self.assertEqual(out.splitlines(), ["1000,3584,8192,nk,128x168x64 s5 g8,70.12,0,1",
                                            "1000,3584,8192,nk,128x128x64 s6 g1,80.00,0,0",
                                            "300,1000,100,kn,64x64x64 s13 g1 sk2,2.50,0,1"])
        bad = {"results": [result(300, 1000, 100, "kn", "64x64x64 s13 g1 sk2", 2.5, nwrong=3)]}
        r = run_script("gemm_fit_table.py", "rows", File("c.txt", CHOICES), File("bad.json", bad), check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("has 3 wrong elements", r.stderr)

    def test_bad_tables_and_listings_are_named(self):
        r = run_script("gemm_fit_table.py", "shapes", File("t.csv", "m,n,k\n1,2,3\n"), check=False)
        self.assertIn("t.csv:1: expected the header", r.stderr)
        r = run_script("gemm_fit_table.py", "entries", File("t.csv", TABLE), "--choices",
                       File("c.txt", "1000 3584 8192 nk 128x168x64 s5 g8\n"), check=False)
        self.assertIn("the listing has no choice for 3 of the tables' shapes, e.g. 1024 3584 8192 nk", r.stderr)
        r = run_script("gemm_fit_table.py", "tables", check=False)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
