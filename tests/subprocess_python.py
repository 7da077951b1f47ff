"""Run Python in a fresh interpreter and read its log: for tests that need a fresh XLA runtime (this
process may already run XLA:CPU) or that a failed PJRT client may abort."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

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
