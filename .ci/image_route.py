"""Prove the container route on this machine: image, tests inside it, compose, dev container.

Usage: python .ci/image_route.py --compose PATH --devcontainer PATH [--record FILE]
(run by `nox -s image`, which installs Compose v2 from locks/compose.txt and the dev container CLI
from .ci/devcontainer-cli/package-lock.json, and passes their paths).

0. Stops at once, saying so, when the scratch folder's filesystem has less free disk than the
   route's measured peak (NEEDED_FREE_BYTES).
1. A Docker daemon: the running one, else a private dockerd started here (--iptables=false
   --bridge=none: host networking, the machine's firewall and routing untouched; its own data
   root, exec root and socket under a temporary folder), stopped by pid at the end.
2. The base image: XLA_GPU_OPS_BASE_IMAGE if set (e.g. the CUDA devel image on a GPU host), else a
   Debian 12 made here with debootstrap and `docker import` (no image registry needed).
3. `docker build` of the runtime and dev targets (BuildKit, host network, the machine's extra CA
   certificates as the build secret extra_ca when it has some, the checkout owner's uid/gid).
4. CI's command (the image's CMD) inside the container; pytest's summaries checked as in .ci/run.
5. `docker compose run --rm tests` with compose.cpu.yaml (no GPU reservation) and an override
   written here (host network, the machine's CA bundle read-only for run-time downloads).
6. The dev container (`devcontainer up`), then edit-in-place: a host edit to a Python module and
   to a kernel source is seen inside; `nox -s build` there rebuilds just that object; an import
   sees the Python change; the image is unchanged. The edits are undone (content and mtime).
7. Removes every container, volume and image it made (and the daemon's data when it started
   one); prints the time, the image size and the disk (free at the start, peak use, least free),
   and writes a record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import pytest_summaries  # beside this file

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "xla-gpu-ops"  # compose.yaml's `name`
RUNTIME_IMAGE = f"{PROJECT}:runtime"
DEV_IMAGE = f"{PROJECT}:dev"
LOCAL_BASE = f"{PROJECT}-base:bookworm"
# Free disk the route needs on the filesystem of its scratch folder (under TMPDIR; it holds the data
# root of the daemon the route starts): its measured peak above the start was 26.4 GB
# (docs/records/ci-run.md: the image, compose's .nox volume filled from it, the torch_xla 2.7
# stack installed there at run time). With less, it stops before building and says so.
NEEDED_FREE_BYTES = 27 * 10**9
# CI's command runs pytest twice: `tests` (default stack) and `xla_cuda` (torch_xla 2.7 stack).
PYTEST_RUNS = 2
PYTHON_PROBE_FILE = ROOT / "xla_gpu_ops" / "__init__.py"
KERNEL_PROBE_FILE = ROOT / "kernels" / "src" / "simple_add_launch.cu"
KERNEL_PROBE_OBJECT = "CMakeFiles/xla_gpu_ops.dir/src/simple_add_launch.cu.o"


def log(message: str) -> None:
    print(f"image: {message}", flush=True)


def docker_cli() -> str:
    """Debian's docker CLI (with BuildKit built in) before any other on PATH: a newer CLI
    without the buildx plugin cannot build with BuildKit."""
    return (
        "/usr/bin/docker"
        if Path("/usr/bin/docker").is_file()
        else shutil.which("docker") or "docker"
    )


class Route:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch = Path(tempfile.mkdtemp(prefix="xgo-image-"))
        self.env = dict(os.environ)
        self.daemon: subprocess.Popen | None = None
        self.record: dict[str, object] = {}
        self.made_images: list[str] = []
        self.failures: list[str] = []
        self.peak_used = 0
        start = shutil.disk_usage(self.scratch)
        self.start_used, self.start_free = start.used, start.free
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample_disk, daemon=True)
        owner = ROOT.stat()
        self.uid, self.gid = owner.st_uid, owner.st_gid

    # ---- helpers -------------------------------------------------------------------------
    def _sample_disk(self) -> None:
        while self._sampling:
            self.peak_used = max(self.peak_used, shutil.disk_usage(self.scratch).used)
            time.sleep(2)

    def run(self, *command: str, check: bool = True, capture: bool = False, log_to: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run a command; stream its output (and copy it to log_to), or capture it."""
        full_env = {**self.env, **(env or {})}
        if capture:
            result = subprocess.run(
                command, env=full_env, capture_output=True, text=True, check=False
            )
        else:
            with subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace") as process:  # fmt: skip
                lines = []
                assert process.stdout is not None
                for line in process.stdout:
                    sys.stdout.write(line)
                    lines.append(line)
                process.wait()
            text = "".join(lines)
            if log_to is not None:
                log_to.write_text(text)
            result = subprocess.CompletedProcess(command, process.returncode, text, "")
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command[:6])} ... exited {result.returncode}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
        return result

    def docker(self, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return self.run(docker_cli(), *args, **kwargs)

    def compose_files(self) -> list[str]:
        return ["-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml"),
                "-f", str(self.scratch / "compose.ci.yaml")]  # fmt: skip

    def compose(self, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return self.docker("compose", *self.compose_files(), *args, **kwargs)

    def check_summaries(self, where: str, text: str) -> list[str]:
        found = pytest_summaries.summaries(text)
        wrong = pytest_summaries.problems(found, PYTEST_RUNS)
        for line in found:
            log(f"{where}: {line}")
        self.failures += [f"{where}: {problem}" for problem in wrong]
        return found

    def record_suite(self, key: str, where: str, command: str, what: str,
                     result: subprocess.CompletedProcess[str], started: float) -> None:  # fmt: skip
        """A run of CI's command: its exit, time and pytest summaries in the record; when it
        failed, a failure naming `what` and the failing lines of its output."""
        entry = self.record[key] = {
            "command": command, "exit": result.returncode,
            "time": f"{time.monotonic() - started:.0f} s",
            "pytest": self.check_summaries(where, result.stdout),
        }  # fmt: skip
        if result.returncode != 0:
            self.failures.append(f"{where}: {what} exited {result.returncode}")
            entry["failed lines"] = failed_lines(result.stdout)

    # ---- steps ---------------------------------------------------------------------------
    def start_daemon(self) -> None:
        # A docker CLI config of our own: the Compose v2 plugin, and nothing of the user's.
        config = self.scratch / "docker-config"
        (config / "cli-plugins").mkdir(parents=True)
        (config / "cli-plugins" / "docker-compose").symlink_to(self.args.compose)
        self.env["DOCKER_CONFIG"] = str(config)
        self.env["DOCKER_BUILDKIT"] = "1"
        # The dev container CLI calls `docker` from PATH: give it the same CLI as ours.
        shim = self.scratch / "bin"
        shim.mkdir()
        (shim / "docker").symlink_to(docker_cli())
        self.env["PATH"] = f"{shim}:{self.env['PATH']}"
        if self.docker("info", check=False, capture=True).returncode == 0:
            log("using the running Docker daemon")
            return
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not Path(dockerd).is_file():
            raise RuntimeError("no dockerd: install Docker (Debian: apt-get install docker.io)")
        socket = self.scratch / "docker.sock"
        daemon_log = (self.scratch / "dockerd.log").open("w")  # the daemon writes it until stopped
        self.daemon = subprocess.Popen(
            [dockerd, "--data-root", str(self.scratch / "data"), "--exec-root", str(self.scratch / "exec"),
             "--pidfile", str(self.scratch / "dockerd.pid"), "--host", f"unix://{socket}",
             "--iptables=false", "--bridge=none"],
            stdout=daemon_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.env["DOCKER_HOST"] = f"unix://{socket}"
        for _ in range(60):
            if self.docker("info", check=False, capture=True).returncode == 0:
                log(
                    f"started dockerd (pid {self.daemon.pid}) with data root {self.scratch / 'data'}"
                )
                return
            time.sleep(1)
        raise RuntimeError(
            f"dockerd did not start: {(self.scratch / 'dockerd.log').read_text()[-2000:]}"
        )

    def base_image(self) -> str:
        named = os.environ.get("XLA_GPU_OPS_BASE_IMAGE")
        if named:
            log(f"base image {named} (XLA_GPU_OPS_BASE_IMAGE)")
            return named
        debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
        if not Path(debootstrap).is_file():
            raise RuntimeError(
                "no debootstrap to make the Debian base: apt-get install debootstrap"
            )
        rootfs = self.scratch / "rootfs"
        started = time.monotonic()
        self.run(debootstrap, "--variant=minbase", "--include=ca-certificates", "bookworm",
                 str(rootfs), "http://deb.debian.org/debian", capture=True)  # fmt: skip
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            subprocess.run([docker_cli(), "import", "-", LOCAL_BASE], stdin=tar.stdout, env=self.env,
                           check=True, capture_output=True)  # fmt: skip
        shutil.rmtree(rootfs)
        self.made_images.append(LOCAL_BASE)
        self.record["base"] = (
            f"Debian 12 (debootstrap minbase + docker import), {time.monotonic() - started:.0f} s"
        )
        log(f"base image {LOCAL_BASE}: {self.record['base']}")
        return LOCAL_BASE

    def extra_ca(self) -> Path | None:
        """The machine's extra CA certificates as one PEM file (kept in the scratch folder)."""
        named = os.environ.get("XLA_GPU_OPS_EXTRA_CA")
        sources = (
            [Path(named)]
            if named
            else sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))
        )
        if not sources:
            return None
        bundle = self.scratch / "extra-ca.pem"
        bundle.write_text("".join(path.read_text() for path in sources))
        bundle.chmod(0o600)
        return bundle

    def build(self, base: str) -> None:
        secret = self.extra_ca()
        common = ["build", "--network", "host", "--progress", "plain",
                  "--build-arg", f"BASE_IMAGE={base}",
                  "--build-arg", f"XLA_GPU_OPS_CUDA_ARCHS={self.env.get('XLA_GPU_OPS_CUDA_ARCHS', '90a')}",
                  "--build-arg", f"USER_UID={self.uid}", "--build-arg", f"USER_GID={self.gid}",
                  *(["--secret", f"id=extra_ca,src={secret}"] if secret else [])]  # fmt: skip
        for target, tag in (("runtime", RUNTIME_IMAGE), ("dev", DEV_IMAGE)):
            started = time.monotonic()
            self.docker(
                *common,
                "--target",
                target,
                "-t",
                tag,
                str(ROOT),
                log_to=self.scratch / f"build-{target}.log",
            )
            self.made_images.append(tag)
            self.record[f"build {target}"] = f"{time.monotonic() - started:.0f} s"
        size = int(
            self.docker("image", "inspect", "-f", "{{.Size}}", RUNTIME_IMAGE, capture=True).stdout
        )
        self.record["runtime image size"] = f"{size / 1e9:.2f} GB ({size} bytes)"
        log(f"runtime image: {self.record['runtime image size']}")
        history = self.docker(
            "history", "--format", "{{.Size}}\t{{.CreatedBy}}", RUNTIME_IMAGE, capture=True
        ).stdout
        self.record["runtime image layers"] = [
            line[:120] for line in history.splitlines() if not line.startswith("0B")
        ]

    def run_in_container(self) -> None:
        """CI's command, the image's CMD, in a container of the runtime image (no bind mount, no
        volume: what it downloads stays in the container and goes with it)."""
        started = time.monotonic()
        result = self.docker(
            "run", "--rm", "--network", "host", "-e", "JAX_PLATFORMS=cpu",
            "-v", "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
            RUNTIME_IMAGE, check=False, log_to=self.scratch / "container.log",
        )  # fmt: skip
        self.record_suite("in container", "container", "the image's CMD (CI's command)",
                          "CI's command", result, started)  # fmt: skip

    def write_compose_override(self) -> None:
        """Host network (the daemon has no bridge), the machine's CA bundle for run-time downloads,
        and the images built above as they are (no `build:`: compose and the dev container CLI
        would otherwise rebuild, or look for the default base image in a registry)."""
        service = (
            "    network_mode: host\n"
            "    build: !reset null\n"
            "    environment:\n      JAX_PLATFORMS: cpu\n"
            "    volumes:\n"
            "      - /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro\n"
        )
        text = "services:\n" + "".join(f"  {name}:\n{service}" for name in ("tests", "dev"))
        (self.scratch / "compose.ci.yaml").write_text(text)

    def compose_tests(self) -> None:
        started = time.monotonic()
        result = self.compose(
            "run", "--rm", "tests", check=False, log_to=self.scratch / "compose.log"
        )
        self.record_suite(
            "compose", "compose",
            "docker compose -f compose.yaml -f compose.cpu.yaml -f <CI override> run --rm tests",
            "`run --rm tests`", result, started,
        )  # fmt: skip

    def devcontainer_config(self) -> Path:
        """.devcontainer/devcontainer.json with the no-GPU and CI compose overrides added."""
        text = (ROOT / ".devcontainer" / "devcontainer.json").read_text()
        sys.path.insert(0, str(ROOT / ".ci"))
        from lint_containers import strip_jsonc_comments

        config = json.loads(strip_jsonc_comments(text))
        config["dockerComposeFile"] = [self.compose_files()[i] for i in (1, 3, 5)]
        config["hostRequirements"] = {**config.get("hostRequirements", {}), "gpu": "optional"}
        # The image was built with the checkout owner's uid/gid already: no derived image.
        config["updateRemoteUserUID"] = False
        path = self.scratch / "devcontainer.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def devcontainer(self) -> None:
        config = self.devcontainer_config()
        cli = [
            self.args.devcontainer,
            "--workspace-folder",
            str(ROOT),
            "--override-config",
            str(config),
        ]
        image_before = self.docker(
            "image", "inspect", "-f", "{{.Id}}", DEV_IMAGE, capture=True
        ).stdout.strip()
        started = time.monotonic()
        self.run(cli[0], "up", *cli[1:], log_to=self.scratch / "devcontainer-up.log")
        check: dict[str, object] = {
            "up": f"{time.monotonic() - started:.0f} s (postCreateCommand nox -s build)"
        }
        token = secrets.token_hex(6)
        originals = {
            path: (path.read_bytes(), path.stat())
            for path in (PYTHON_PROBE_FILE, KERNEL_PROBE_FILE)
        }
        try:
            with PYTHON_PROBE_FILE.open("a") as handle:
                handle.write(f'\n_EDIT_IN_PLACE_PROBE = "{token}"\n')
            with KERNEL_PROBE_FILE.open("a") as handle:
                handle.write(f"\n// edit-in-place probe {token}\n")
            seen = self.run(cli[0], "exec", *cli[1:], "grep", "-c", token,
                            "/work/kernels/src/simple_add_launch.cu", check=False, capture=True)  # fmt: skip
            check["kernel edit seen inside"] = seen.returncode == 0
            rebuilt = self.run(cli[0], "exec", *cli[1:], "nox", "-s", "build", check=False,
                               log_to=self.scratch / "devcontainer-build.log")  # fmt: skip
            compiled = re.findall(r"\[\d+/\d+\] Building \w+ object (\S+)", rebuilt.stdout)
            check["nox -s build compiled"] = compiled
            check["nox -s build linked"] = "Linking CXX shared library" in rebuilt.stdout
            imported = self.run(cli[0], "exec", *cli[1:], "/work/.nox/tests/bin/python", "-c",
                                "import xla_gpu_ops; print(xla_gpu_ops._EDIT_IN_PLACE_PROBE)",
                                check=False, capture=True)  # fmt: skip
            check["python edit seen by an import"] = token in imported.stdout
            image_after = self.docker(
                "image", "inspect", "-f", "{{.Id}}", DEV_IMAGE, capture=True
            ).stdout.strip()
            check["image unchanged"] = image_before == image_after
        finally:
            for path, (content, stat) in originals.items():
                path.write_bytes(content)
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        self.record["dev container"] = check
        expected = {"kernel edit seen inside": True, "nox -s build compiled": [KERNEL_PROBE_OBJECT],
                    "nox -s build linked": True, "python edit seen by an import": True,
                    "image unchanged": True}  # fmt: skip
        for key, value in expected.items():
            if check.get(key) != value:
                self.failures.append(
                    f"dev container: {key}: {check.get(key)!r}, expected {value!r}"
                )

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.compose("down", "--volumes", "--remove-orphans", check=False, capture=True)
        containers = self.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}",
                                 check=False, capture=True).stdout.split()  # fmt: skip
        containers += self.docker("ps", "-aq", "--filter", f"ancestor={DEV_IMAGE}", check=False,
                                  capture=True).stdout.split()  # fmt: skip
        if containers:
            self.docker("rm", "-f", *sorted(set(containers)), check=False, capture=True)
        volumes = self.docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
                              check=False, capture=True).stdout.split()  # fmt: skip
        if volumes:
            self.docker("volume", "rm", "-f", *volumes, check=False, capture=True)
        # the dev container CLI's own derived images (vsc-*), then ours
        derived = self.docker(
            "images", "-q", "--filter", "reference=vsc-*", check=False, capture=True
        ).stdout.split()
        self.docker("rmi", "-f", *derived, *self.made_images, check=False, capture=True)
        if self.daemon is not None:
            self.docker("builder", "prune", "-af", check=False, capture=True)
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
            log(f"stopped dockerd (pid {self.daemon.pid})")
            # what the daemon leaves mounted in its exec root (the host network namespace)
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
            for mount in sorted(
                (m for m in mounts if m.startswith(f"{self.scratch}/")), reverse=True
            ):
                subprocess.run(["umount", mount], check=False, capture_output=True)
        self._sampling = False
        if self.args.record:  # the steps' logs outlive the scratch directory, next to the record
            logs = Path(self.args.record).parent / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            for path in self.scratch.glob("*.log"):
                shutil.copy(path, logs / path.name)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.scratch.exists():
            self.failures.append(f"could not remove {self.scratch}")

    def main(self) -> int:
        started = time.monotonic()
        self._sampler.start()
        try:
            if self.start_free < NEEDED_FREE_BYTES:
                raise RuntimeError(
                    f"{self.start_free / 1e9:.1f} GB free on the filesystem of {self.scratch.parent}; "
                    f"the container route needs {NEEDED_FREE_BYTES / 1e9:.0f} GB (its measured peak)"
                )
            self.start_daemon()
            self.build(self.base_image())
            self.run_in_container()
            self.write_compose_override()
            self.compose_tests()
            self.devcontainer()
        except Exception as error:  # report it with the rest; cleanup still runs
            self.failures.append(f"{type(error).__name__}: {error}")
        finally:
            self.cleanup()
        self.record["total time"] = f"{time.monotonic() - started:.0f} s"
        peak = max(0, self.peak_used - self.start_used)
        self.record["disk (filesystem of the scratch folder)"] = {
            "free at the start": f"{self.start_free / 1e9:.1f} GB",
            "peak use above the start": f"{peak / 1e9:.1f} GB",
            "least free": f"{(self.start_free - peak) / 1e9:.1f} GB",
        }
        self.record["result"] = "FAILED: " + "; ".join(self.failures) if self.failures else "ok"
        text = json.dumps(self.record, indent=2)
        print(text)
        if self.args.record:
            Path(self.args.record).parent.mkdir(parents=True, exist_ok=True)
            Path(self.args.record).write_text(text + "\n")
        log(f"total {self.record['total time']}, peak disk {peak / 1e9:.1f} GB of "
            f"{self.start_free / 1e9:.1f} GB free, result {self.record['result']}")  # fmt: skip
        return 1 if self.failures else 0


def failed_lines(text: str, tail: int = 30) -> list[str]:
    """What a failed step's reader needs first: nox's failure lines, pytest's FAILED/ERROR lines,
    then the last lines of the output."""
    lines = text.splitlines()
    marked = [
        line for line in lines
        if line.startswith(("FAILED ", "ERROR ")) or (line.startswith("nox > ") and "failed" in line)
    ]  # fmt: skip
    return [line[:300] for line in [*marked[:40], "...", *lines[-tail:]]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--compose", required=True, help="the Compose v2 binary (docker CLI plugin)"
    )
    parser.add_argument("--devcontainer", required=True, help="the dev container CLI")
    parser.add_argument("--record", help="write the record (JSON) here")
    return Route(parser.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
