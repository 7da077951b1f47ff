"""Read pytest's closing lines ("==== 40 passed, 3 skipped in 52.1s ====") from a log the way CI
does: every pytest run passed something and failed nothing (.ci/readme.py)."""

from __future__ import annotations

import re

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
