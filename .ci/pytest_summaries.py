"""Check a log of nox sessions the way CI does: every pytest run in it passed something, none failed.

Usage: python .ci/pytest_summaries.py LOG [EXPECTED_RUNS]

Prints each pytest closing line ("==== 40 passed, 3 skipped in 52.1s ====") and exits 1 when there
is none, fewer than EXPECTED_RUNS, or one without a passed test or with failures or errors.
Used by .ci/run (the host suite) and .ci/image_route.py (inside the container and through compose).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY = re.compile(
    r"^=+ .*(passed|failed|error|errors|skipped|no tests ran|deselected).* in [0-9.]+s.* =+$"
)


def summaries(text: str) -> list[str]:
    lines = ANSI.sub("", text).splitlines()
    return [line.strip() for line in lines if SUMMARY.match(line.strip())]


def problems(found: list[str], expected_runs: int = 1) -> list[str]:
    """What is wrong with a log's pytest summaries ([] when all is well)."""
    wrong = []
    if len(found) < expected_runs:
        wrong.append(f"{len(found)} pytest summary line(s), expected {expected_runs}")
    for line in found:
        if not re.search(r"\d+ passed", line) or re.search(r"\d+ (failed|errors?)\b", line):
            wrong.append(f"no test passed, or failures: {line}")
    return wrong


def main(argv: list[str]) -> int:
    text = Path(argv[1]).read_text(errors="replace")
    expected = int(argv[2]) if len(argv) > 2 else 1
    found = summaries(text)
    for line in found:
        print(line)
    wrong = problems(found, expected)
    for problem in wrong:
        print(f"ci: FAILED: {problem}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
