"""Make a machine without an image registry ready for README's container commands.

Usage: python tools/prepare_docker.py --compose PATH [--rebuild]
(run by `nox -s docker`, which installs Compose v2 from locks/compose.txt and passes its binary).

Each step is skipped when its result is already there:
1. Docker Engine and debootstrap: Debian's docker.io and debootstrap, installed with apt-get when
   missing (as root).
2. A daemon: the running one; else dockerd, started in the background with its defaults (as root;
   its log in .nox/dockerd.log). It keeps running afterwards: it is the machine's daemon now.
3. Compose v2: `docker compose` as it is; else the locked binary copied to the docker CLI's plugin
   folder ($DOCKER_CONFIG or ~/.docker, cli-plugins/docker-compose), never over an existing file.
4. The base image: XLA_GPU_OPS_BASE_IMAGE if set; else xla-gpu-ops-base:bookworm, a Debian 12
   made here with debootstrap and `docker import`.
5. The images compose.yaml names (runtime, dev, xla-cuda), built with BuildKit from its build
   settings (`docker compose config`), the checkout owner's uid/gid, and the machine's extra CA
   certificates (/usr/local/share/ca-certificates, or XLA_GPU_OPS_EXTRA_CA) as the build secret
   extra_ca. An image is rebuilt when its inputs (Dockerfile, locks, noxfile) changed since it was
   built, or with --rebuild; a rebuild of an unchanged image is a BuildKit cache hit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_BASE = "xla-gpu-ops-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
INPUTS_LABEL = "org.xla-gpu-ops.inputs"  # hash of what the image's venvs are made from
DAEMON_LOG = ROOT / ".nox" / "dockerd.log"


def log(message: str) -> None:
    print(f"docker: {message}", flush=True)


def fail(message: str) -> None:
    sys.exit(f"docker: {message}")


def run(
    *command: str, capture: bool = False, env: dict[str, str] | None = None, **kwargs
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=capture,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def is_root() -> bool:
    return os.geteuid() == 0


def ensure_packages() -> None:
    missing = [
        package
        for package, program in (("docker.io", "dockerd"), ("debootstrap", "debootstrap"))
        if shutil.which(program) is None and not Path("/usr/sbin", program).is_file()
    ]
    if os.environ.get("XLA_GPU_OPS_BASE_IMAGE") and "debootstrap" in missing:
        missing.remove("debootstrap")  # a named base needs no local Debian
    if shutil.which("docker") and run("docker", "info", capture=True).returncode == 0:
        missing = [p for p in missing if p != "docker.io"]  # a daemon answers already
    if not missing:
        return
    if not (is_root() and shutil.which("apt-get")):
        fail(f"missing {' and '.join(missing)}: as root, apt-get install -y {' '.join(missing)}")
    log(f"installing {', '.join(missing)} (apt-get)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    for command in (("apt-get", "update", "-qq"), ("apt-get", "install", "-y", "-qq", *missing)):
        if run(*command, env=env).returncode != 0:
            fail(f"`{' '.join(command)}` failed")


def docker_cli() -> str:
    """A docker CLI that builds with BuildKit: the one on PATH when it can (buildx, or a CLI
    before 23 with BuildKit built in), else Debian's /usr/bin/docker."""
    candidates = [shutil.which("docker"), "/usr/bin/docker"]
    for cli in dict.fromkeys(c for c in candidates if c and Path(c).is_file()):
        help_text = run(cli, "build", "--help", capture=True, env={"DOCKER_BUILDKIT": "1"})
        if help_text.returncode == 0 and "--secret" in help_text.stdout:
            return cli
    fail("no docker CLI builds with BuildKit here: install docker.io (Debian) or docker-buildx")
    raise AssertionError  # unreachable


def ensure_daemon(cli: str) -> None:
    if run(cli, "info", capture=True).returncode == 0:
        log("Docker daemon: running")
        return
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not is_root():
        fail("no Docker daemon answers: start it (as root: dockerd &, or systemctl start docker)")
    DAEMON_LOG.parent.mkdir(exist_ok=True)
    with DAEMON_LOG.open("a") as daemon_log:
        process = subprocess.Popen(
            [dockerd], stdout=daemon_log, stderr=subprocess.STDOUT, start_new_session=True
        )
    for _ in range(60):
        if run(cli, "info", capture=True).returncode == 0:
            log(f"Docker daemon: started dockerd (pid {process.pid}, log {DAEMON_LOG})")
            return
        if process.poll() is not None:
            break
        time.sleep(1)
    fail(f"dockerd did not start; its log, {DAEMON_LOG}:\n{DAEMON_LOG.read_text()[-2000:]}")


def ensure_compose(locked_binary: Path) -> None:
    if run("docker", "compose", "version", capture=True).returncode == 0:
        log("Compose v2: present")
        return
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    plugin = config / "cli-plugins" / "docker-compose"
    if plugin.exists():
        fail(f"{plugin} exists but `docker compose version` fails: remove or fix it")
    plugin.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(locked_binary, plugin)
    if run("docker", "compose", "version", capture=True).returncode != 0:
        fail(f"copied Compose v2 to {plugin}, but `docker compose version` still fails")
    log(f"Compose v2: copied the locked binary to {plugin}")


def image_exists(cli: str, image: str) -> bool:
    return run(cli, "image", "inspect", image, capture=True).returncode == 0


def ensure_base(cli: str) -> str:
    named = os.environ.get("XLA_GPU_OPS_BASE_IMAGE")
    if named:
        log(f"base image: {named} (XLA_GPU_OPS_BASE_IMAGE)")
        return named
    if image_exists(cli, LOCAL_BASE):
        log(f"base image: {LOCAL_BASE}")
        return LOCAL_BASE
    if not is_root():
        fail(f"no {LOCAL_BASE}: debootstrap needs root (or set XLA_GPU_OPS_BASE_IMAGE)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xgo-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        made = run(
            shutil.which("debootstrap") or "/usr/sbin/debootstrap",
            "--variant=minbase",
            "--include=ca-certificates",
            "bookworm",
            str(rootfs),
            DEBIAN_MIRROR,
            capture=True,
        )
        if made.returncode != 0:
            fail(f"debootstrap failed:\n{(made.stdout + made.stderr)[-2000:]}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            imported = subprocess.run(
                [cli, "import", "-", LOCAL_BASE],
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                check=False,
            )
        if imported.returncode != 0:
            fail(f"docker import failed: {imported.stderr.strip()}")
    log(f"base image: made {LOCAL_BASE} (debootstrap, {time.monotonic() - started:.0f} s)")
    return LOCAL_BASE


def owner_ids() -> dict[str, str]:
    """XGO_UID / XGO_GID of compose.yaml: the checkout owner's, so a bind mount stays writable."""
    owner = ROOT.stat()
    return {"XGO_UID": str(owner.st_uid), "XGO_GID": str(owner.st_gid)}


def compose_builds() -> list[tuple[str, dict]]:
    """(image, build settings) of every image compose.yaml builds, in the order of the Dockerfile's
    stages (a dev image builds on the runtime one)."""
    config = run(
        "docker",
        "compose",
        "-f",
        str(ROOT / "compose.yaml"),
        "config",
        "--format",
        "json",
        capture=True,
        env=owner_ids(),
    )
    if config.returncode != 0:
        fail(f"docker compose config failed: {config.stderr.strip()}")
    builds: dict[str, dict] = {}
    for service in json.loads(config.stdout)["services"].values():
        if "build" in service:
            builds.setdefault(service["image"], service["build"])
    stages = [
        line.split()[-1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("FROM ") and " AS " in line
    ]
    return sorted(builds.items(), key=lambda item: stages.index(item[1]["target"]))


def inputs_hash(base: str, args: dict[str, str]) -> str:
    """What an image's venvs are made from: the Dockerfile, the locks, the noxfile, the build
    helper, the base and the build arguments."""
    digest = hashlib.sha256(f"{base}\n{sorted(args.items())}\n".encode())
    for path in [
        ROOT / "Dockerfile",
        ROOT / "noxfile.py",
        ROOT / ".ci" / "with-build-ca",
        *sorted((ROOT / "locks").glob("*.txt")),
    ]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def extra_ca(scratch: Path) -> Path | None:
    """The machine's extra CA certificates as one PEM file (for a TLS-re-signing proxy)."""
    named = os.environ.get("XLA_GPU_OPS_EXTRA_CA")
    sources = (
        [Path(named)]
        if named
        else sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
    )
    if not sources:
        return None
    bundle = scratch / "extra-ca.pem"
    bundle.write_text("".join(path.read_text() for path in sources))
    return bundle


def build_images(cli: str, base: str, rebuild: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="xgo-docker-") as scratch:
        secret = extra_ca(Path(scratch))
        for image, build in compose_builds():
            args = {**build.get("args", {}), "BASE_IMAGE": base}
            inputs = inputs_hash(base, args)
            current = run(
                cli,
                "image",
                "inspect",
                "--format",
                f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}',
                image,
                capture=True,
            )
            if not rebuild and current.returncode == 0 and current.stdout.strip() == inputs:
                log(f"{image}: up to date")
                continue
            started = time.monotonic()
            command = [
                cli,
                "build",
                "--progress",
                "plain",
                "--target",
                build["target"],
                "-t",
                image,
                "--label",
                f"{INPUTS_LABEL}={inputs}",
                *(f"--build-arg={key}={value}" for key, value in sorted(args.items())),
                *(["--secret", f"id=extra_ca,src={secret}"] if secret else []),
                str(ROOT),
            ]
            log(f"{image}: building target {build['target']} on {base}")
            if run(*command, env={"DOCKER_BUILDKIT": "1"}).returncode != 0:
                fail(f"building {image} failed (its output is above)")
            size = run(cli, "image", "inspect", "--format", "{{.Size}}", image, capture=True)
            log(
                f"{image}: built in {time.monotonic() - started:.0f} s, "
                f"{int(size.stdout) / 1e9:.2f} GB"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", required=True, type=Path, help="the locked Compose v2 binary")
    parser.add_argument("--rebuild", action="store_true", help="build every image again")
    args = parser.parse_args()
    ensure_packages()
    cli = docker_cli()
    ensure_daemon(cli)
    ensure_compose(args.compose)
    build_images(cli, ensure_base(cli), args.rebuild)
    log("ready: docker compose -f compose.yaml -f compose.cpu.yaml run --rm tests (README)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
