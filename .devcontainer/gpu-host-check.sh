#!/bin/sh
# initializeCommand of the GPU dev containers, on the host before anything is pulled or built:
# compose would otherwise retry `docker pull` of the CUDA base for minutes on a machine without a
# GPU or an image registry, and never say that .devcontainer/cpu/ is the configuration to use.
base=$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)
fail() {
  cat >&2 <<MESSAGE
xla-gpu-ops: this dev container needs a GPU host: $1.
A GPU host has the NVIDIA Container Toolkit (docker's "nvidia" runtime) and can pull $base.
Anywhere else, use the CPU dev container (README.md, "Containers"):
  nox -s docker    # once: installs Docker if missing, makes the images from a local Debian base
  devcontainer up --workspace-folder . --config .devcontainer/cpu/devcontainer.json
MESSAGE
  exit 1
}
runtimes=$(docker info --format '{{json .Runtimes}}' 2>/dev/null) || fail "docker does not answer"
case "$runtimes" in
  *nvidia*) ;;
  *) fail "docker has no \"nvidia\" runtime" ;;
esac
if ! docker image inspect "$base" >/dev/null 2>&1 && ! getent hosts registry-1.docker.io >/dev/null; then
  fail "$base is not here and its registry does not resolve"
fi
