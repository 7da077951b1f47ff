"""README's commands as CI reads them (.ci/readme.py): which run, in what order, and how.

CI itself runs them (.ci/run); these tests check the reading, so that a README edit cannot drop a
command from CI without a failure here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
import readme  # noqa: E402

pytestmark = pytest.mark.lint


def test_readme_runs_the_two_commands_and_the_containers() -> None:
    run = [step.words for step in readme.steps() if step.runs and step.kind == "bash"]
    assert ["nox", "-s", "build", "kernels", "hlo"] in run  # the main job
    assert ["nox", "-s", "lint", "tests", "xla_cuda"] in run  # the tests
    assert run.index(["nox", "-s", "build", "kernels", "hlo"]) == 1  # right after the bootstrap
    for service in ("tests", "tests-xla-cuda"):
        assert any(w[:2] == ["docker", "compose"] and w[-1] == service for w in run), service
    assert any(w[:2] == ["devcontainer", "up"] for w in run)


def test_gpu_host_block_is_read_but_not_run() -> None:
    skipped = [step.words for step in readme.steps() if not step.runs]
    assert ["docker", "compose", "run", "--rm", "tests"] in skipped
    assert ["devcontainer", "up", "--workspace-folder", "."] in skipped


def test_python_snippets_are_complete_programs() -> None:
    snippets = [step for step in readme.steps() if step.kind == "python"]
    assert len(snippets) >= 2  # PyTorch; JAX with torchax
    for step in snippets:
        compile(step.text, f"README.md:{step.line}", "exec")  # a SyntaxError names the line
        assert "import " in step.text.split("\n", 1)[0], f"README.md:{step.line} starts mid-program"


def test_parsing_of_blocks(tmp_path: Path) -> None:
    text = (
        "intro\n```bash\necho one   # a comment\n# a comment line\nexport A=1 \\\n  B=2\n```\n"
        "```bash gpu-host\nnvidia-smi\n```\n```python\nimport os\nprint(os.sep)\n```\n"
        "```json\n{}\n```\n"
    )
    path = tmp_path / "README.md"
    path.write_text(text)
    found = readme.steps(path)
    assert [(s.kind, s.runs, s.line) for s in found] == [
        ("bash", True, 3),
        ("bash", True, 5),
        ("bash", False, 9),
        ("python", True, 12),
    ]
    assert found[0].words == ["echo", "one"]
    assert found[1].text == "export A=1    B=2"
    assert found[3].text == "import os\nprint(os.sep)\n"


def test_script_runs_steps_in_one_shell_with_markers(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(
        "```bash\nexport XGO_T=7\n```\n```python\nimport os\nprint(os.environ['XGO_T'])\n```\n"
    )
    steps = readme.steps(path)
    script = readme.script(steps).replace("python - <<", f"{sys.executable} - <<")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert [line.split()[1:3] for line in lines if line.startswith(readme.MARK)] == [
        ["start", "0"],
        ["end", "0"],
        ["start", "1"],
        ["end", "1"],
    ]
    assert "7" in lines  # the export reached the python program: one shell


def test_a_stopped_step_is_named_and_the_rest_listed_as_not_run(tmp_path: Path) -> None:
    """The summary names the step that failed and lists the later ones as not run, instead of
    reporting them as runs without pytest."""
    path = tmp_path / "README.md"
    path.write_text("```bash\necho one\n```\n```bash\nfalse\n```\n```bash\necho three\n```\n")
    code, results = readme.run_steps(readme.steps(path), tmp_path / "log")
    assert code != 0
    assert [entry["ended"] for entry in results] == [True, False, False]
    assert readme.stop_problems(code, results) == [
        f"README's commands stopped with exit {code} at: false",
        "not run: echo three",
    ]
    problems: list[str] = []
    readme.check_pytest(results, problems)
    assert problems == []


def test_list_names_every_step() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme.py"), "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(out.splitlines()) == len(readme.steps())
    assert "skip README:" in out
    assert "run  README:" in out
