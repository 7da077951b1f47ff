"""Run Python in a fresh interpreter and read its log: for tests that need a fresh XLA runtime (this
process may already run XLA:CPU) or that a failed PJRT client may abort."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUBPROCESS_TIMEOUT_S = 600  # importing torch_xla alone takes 30 s on a busy 2-core machine


def run_python(code: str, env: dict[str, str], log_path: Path) -> str:
    """Run `code` in a fresh interpreter; return stdout+stderr (interleaved), also saved to log_path."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    log_path.write_text(result.stdout)
    assert result.returncode == 0, (
        f"exit {result.returncode}; log {log_path}:\n{result.stdout[-4000:]}"
    )
    return result.stdout


def assert_lines_in_order(log: str, patterns: list[str]) -> None:
    """Each regex matches a line of `log`, each after the previous one's line."""
    lines = log.splitlines()
    position = 0
    for pattern in patterns:
        for index in range(position, len(lines)):
            if re.search(pattern, lines[index]):
                position = index + 1
                break
        else:
            raise AssertionError(
                f"no line matching {pattern!r} after line {position}:\n{log[-4000:]}"
            )


# A script that checks many cases in one fresh interpreter records each case's outcome (its
# result, or the error with its trace) and prints them as one RESULTS line for the test to read.
def recorder(results: dict[str, Any]) -> Callable[[str, Callable[[], Any]], None]:
    """record(name, fn): results[name] = fn(), or the error fn raised (the other cases go on)."""

    def record(name: str, fn: Callable[[], Any]) -> None:
        try:
            results[name] = fn()
        except Exception as error:
            results[name] = {
                "error": f"{type(error).__name__}: {error}"[-3000:],
                "trace": traceback.format_exc()[-3000:],
            }

    return record


def results_of(log: str) -> dict:
    """The RESULTS line of a script's log (`print("RESULTS " + json.dumps(results))`)."""
    lines = [line for line in log.splitlines() if line.startswith("RESULTS ")]
    assert len(lines) == 1, log[-4000:]
    return json.loads(lines[0].removeprefix("RESULTS "))
