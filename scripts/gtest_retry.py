#!/usr/bin/env python3
"""After a failed multi-GPU test run, the tests worth running again, as a gtest filter.

One failing test can end the whole job (a device wait that gives up stops every rank), so the
tests after it fail or never start without saying anything about themselves (r73, 4 GPUs: one
flash_decode failure took 12 later tests with it). This prints a filter of every test that failed
after the first failure, plus every test listed but never started; the first failure itself stands.
Prints nothing when there is nothing to run again.

  gtest_retry.py LOG LIST     LOG: the run's output (ranks interleaved); LIST: --gtest_list_tests
"""
import re
import sys


def listed(path):
    names, suite = [], None
    for line in open(path, errors="replace"):
        line = line.split("#")[0].rstrip()
        if not line or line.startswith("["):
            continue
        if not line.startswith(" ") and line.endswith("."):
            suite = line
        elif line.startswith(" ") and suite:
            names.append(suite + line.strip())
    return list(dict.fromkeys(names))  # ranks may each print the list


def main():
    log_path, list_path = sys.argv[1:3]
    started, failed = set(), []
    for line in open(log_path, errors="replace"):
        m = re.search(r"\[ RUN      \] (\S+)", line)
        if m:
            started.add(m.group(1))
        m = re.search(r"\[  FAILED  \] (\S+) \(\d+ ms\)", line)
        if m and m.group(1) not in failed:
            failed.append(m.group(1))
    retry = failed[1:] + [t for t in listed(list_path) if t not in started]
    print(":".join(dict.fromkeys(retry)))


if __name__ == "__main__":
    main()
