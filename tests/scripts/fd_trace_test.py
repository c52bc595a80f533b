#!/usr/bin/env python3
"""scripts/fd_trace.py --tail on a small trace: the steps of the CTAs that combined, from `attended`
on, skipping events a CTA did not reach, and each step's spread over those CTAs."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "fd_trace.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import fd_trace  # noqa: E402

# cta start attended synced merged pushed arrived combined end sm (ns; 0 = not reached)
TRACE = """0 1000 8000 0 0 0 0 0 8500 7
1 1100 8200 9100 12100 0 0 12300 12500 9
2 1000 7900 8800 20800 0 0 21400 21600 12
"""


class FdTraceTail(unittest.TestCase):
    def setUp(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(TRACE)
        self.path = f.name
        self.rows = [list(map(int, line.split()[1:])) for line in TRACE.splitlines()]

    def tearDown(self):
        os.unlink(self.path)

    def test_steps_of_the_ctas_that_combined(self):
        out = fd_trace.tail_steps(self.rows)
        self.assertEqual([(cta, sm) for cta, sm, _ in out], [(1, 9), (2, 12)])  # CTA 0 never combined
        names = [e for e, _ in out[0][2]]
        self.assertEqual(names, ["attended", "synced", "merged", "combined", "end"])  # pushed/arrived not reached
        got = {e: round(us, 3) for e, us in out[1][2]}
        self.assertEqual(got, {"attended": 6.9, "synced": 0.9, "merged": 12.0, "combined": 0.6, "end": 0.2})

    def test_cli_prints_each_steps_spread(self):
        text = subprocess.run([sys.executable, SCRIPT, "--tail", self.path], check=True, capture_output=True,
                              text=True).stdout
        line = next(x for x in text.splitlines() if "tail step to merged" in x)
        self.assertIn("n=   2", line)
        self.assertIn("min   3.00", line)
        self.assertIn("max  12.00", line)
        self.assertIn("tail cta    2 sm  12: attended 6.90 -> synced +0.90 -> merged +12.00", text)


if __name__ == "__main__":
    unittest.main()
