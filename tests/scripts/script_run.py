"""Runs one of scripts/ on files made for the test: the temp-directory boilerplate the script tests share."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")


class File:
    """An argument written to a temporary file named `name` (text as is, None: not written, a missing
    input; anything else as JSON); the script gets its path."""

    def __init__(self, name, content):
        self.name, self.content = name, content


def run_script(script, *args, check=True):
    """scripts/`script` with `args` (File arguments become paths); the CompletedProcess, text output."""
    with tempfile.TemporaryDirectory() as d:
        argv = []
        for a in args:
            if isinstance(a, File):
                argv.append(os.path.join(d, a.name))
                if a.content is None:
                    continue
                with open(argv[-1], "w") as f:
                    if isinstance(a.content, str):
                        f.write(a.content)
                    else:
                        json.dump(a.content, f)
            else:
                argv.append(a)
        return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *argv], check=check,
                              capture_output=True, text=True)
