#!/usr/bin/env python3
"""scripts/gemm_choice_ab.py: bench entries for the shapes two gemm-choice listings differ on (every
kind of config name), and new / old from the bench JSONs of those entries."""
import unittest

from script_run import File, run_script

OLD = """1000 3584 8192 nk 128x224x64 s4 g1 c2 sk2t
160 4096 4096 kn 192x128x64 s4 g1 swap sk3
128 3584 8192 nk 128x128x64 s6 g1 ck4
4096 4096 8192 kn 128x256x64 s4 g8 c2
"""
NEW = """1000 3584 8192 nk 128x168x64 s5 g8
160 4096 4096 kn 128x128x64 s6 g1

128 3584 8192 nk 128x128x64 s6 g1 ck4
4096 4096 8192 kn 128x256x64 s4 g8 stk
"""


def results(rows):
    return {"results": [{"case": c, "time_us": {"median": t}, "nwrong": w} for c, t, w in rows]}


class GemmChoiceAb(unittest.TestCase):
    def run_script(self, *extra, old=OLD, new=NEW, check=True):
        jsons = [File(f"r{i}.json", x) if isinstance(x, dict) else x for i, x in enumerate(extra)]
        return run_script("gemm_choice_ab.py", File("old.txt", old), File("new.txt", new), *jsons, check=check)

    def test_entries_force_both_configs_of_each_moved_shape(self):
        r = self.run_script()
        self.assertIn("3 of 4 shapes moved", r.stderr)
        entries = r.stdout.split()[1::2]
        self.assertEqual(entries, [
            "M=1000,N=3584,K=8192,layout=nk,tile=128x224,group=1,swap=0,cluster=2,clusterk=1,tailsplit=2",
            "M=1000,N=3584,K=8192,layout=nk,tile=128x168,group=8,swap=0,cluster=1,clusterk=1,splitk=1",
            "M=160,N=4096,K=4096,layout=kn,tile=192x128,group=1,swap=1,cluster=1,clusterk=1,splitk=3",
            "M=160,N=4096,K=4096,layout=kn,tile=128x128,group=1,swap=0,cluster=1,clusterk=1,splitk=1",
            "M=4096,N=4096,K=8192,layout=kn,tile=128x256,group=8,swap=0,cluster=2,clusterk=1,splitk=1",
            "M=4096,N=4096,K=8192,layout=kn,tile=128x256,group=8,swap=0,cluster=1,clusterk=1,streamk=1",
        ])
        self.assertEqual(r.stdout.split()[0::2], ["--shape"] * 6)

    def test_compare_reports_ratios_untimed_and_wrong(self):
        first = results([("M=1000 N=3584 K=8192 nk [128x224x64 s4 g1 c2 sk2t]", 80.0, 0),
                         ("M=1000 N=3584 K=8192 nk [128x168x64 s5 g8]", 60.0, 0),
                         ("M=160 N=4096 K=4096 kn [192x128x64 s4 g1 swap sk3]", 20.0, 0),
                         ("M=160 N=4096 K=4096 kn [128x128x64 s6 g1]", 25.0, 2)])
        second = results([("M=1000 N=3584 K=8192 nk [128x224x64 s4 g1 c2 sk2t]", 84.0, 0),
                          ("M=1000 N=3584 K=8192 nk [128x168x64 s5 g8]", 64.0, 0)])
        out = self.run_script("--compare", first, second).stdout
        lines = out.splitlines()
        self.assertTrue(lines[0].startswith("1000 3584 8192 nk") and lines[0].endswith("0.756"), lines[0])  # 62 / 82
        self.assertTrue(lines[1].endswith("1.250  WRONG"), lines[1])
        self.assertIn("2 shapes timed: new / old geomean 0.972, 1 faster, 1 slower (2%), worst 1.250; "
                      "1 moved shapes untimed; 1 cases with wrong elements", lines[-1])

    def test_listings_must_name_the_same_shapes_and_parse(self):
        r = self.run_script(new=NEW.replace("4096 4096 8192 kn", "4096 4096 8192 nk"), check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("different shapes", r.stderr)
        r = self.run_script(new=NEW + "12 13\n", check=False)
        self.assertIn("new.txt:6: not a gemm-choice line: 12 13", r.stderr)
        r = self.run_script(new=NEW.replace("128x168x64 s5 g8", "tile?"), check=False)
        self.assertIn("unrecognised config name: tile?", r.stderr)


if __name__ == "__main__":
    unittest.main()
