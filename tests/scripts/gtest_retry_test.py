#!/usr/bin/env python3
"""scripts/gtest_retry.py on a log shaped like a multi-rank run's: ranks interleaved, the summary's
FAILED lines (no duration), parameterized names, a list printed once per rank."""
import unittest

from script_run import File, run_script

LOG = """[==========] Running 6 tests from 3 test suites.
[ RUN      ] Dist.First
[       OK ] Dist.First (10 ms)
[ RUN      ] Dist.Root
[rank 2] /x.cu:215: failure
[  FAILED  ] Dist.Root (11793 ms)
[ RUN      ] Dist.Cascade
[rank 1] ?:-1: failure
[  FAILED  ] Dist.Cascade (180 ms)
[ RUN      ] Shapes/P.Case/gd0
[  FAILED  ] Shapes/P.Case/gd0 (0 ms)
[  FAILED  ] 3 tests, listed below:
[  FAILED  ] Dist.Root
[  FAILED  ] Shapes/P.Case/gd0, where GetParam() = 0
"""

LIST = """Dist.
  First
  Root
  Cascade
Shapes/P.
  Case/gd0  # GetParam() = 0
  Case/gd1  # GetParam() = 1
Later.
  Never
Dist.
  First
"""


class GtestRetry(unittest.TestCase):
    def run_script(self, log, listing):
        return run_script("gtest_retry.py", File("log", log), File("list", listing)).stdout.strip()

    def test_failures_after_the_first_and_tests_never_started(self):
        self.assertEqual(self.run_script(LOG, LIST), "Dist.Cascade:Shapes/P.Case/gd0:Shapes/P.Case/gd1:Later.Never")

    def test_nothing_when_only_one_test_failed_and_all_ran(self):
        log = "[ RUN      ] A.x\n[  FAILED  ] A.x (1 ms)\n[ RUN      ] A.y\n[       OK ] A.y (1 ms)\n"
        self.assertEqual(self.run_script(log, "A.\n  x\n  y\n"), "")


if __name__ == "__main__":
    unittest.main()
