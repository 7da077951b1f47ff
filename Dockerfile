# xla-gpu-ops images: the same locks and nox sessions as CI, nothing of their own (README.md,
# "Containers"; docs/ENVIRONMENT.md).
#
#   runtime   the default stack (torch_xla 2.9, jax 0.7.1, torchax): compose's tests, hlo, bench
#   dev       runtime + editor tools: compose's dev, the dev container
#   xla-cuda  the pinned torch_xla 2.7 stack: compose's tests-xla-cuda, dev-xla-cuda
#
# Each image holds the venvs of the sessions its command runs, made from the locks at build time,
# and the kernels built by `nox -s build`: a container runs its sessions with no network. The venvs
# live in /opt/nox and the CMake build in /opt/build, outside /work, so a checkout bind-mounted at
# /work (compose, the dev container) hides neither.
#
# Builds offline from the registries' point of view: no `# syntax=` line (BuildKit would fetch a
# frontend), only the built-in frontend's RUN --mount=type=secret.
#
# Build args:
#   BASE_IMAGE              default the CUDA 12.8 devel image (cuda-gdb, compute-sanitizer and a
#                           system nvcc for XLA_GPU_OPS_NVCC); any Debian 12 / Ubuntu 22.04 image
#                           works (`nox -s docker` uses a local Debian 12 made with debootstrap)
#   XLA_GPU_OPS_CUDA_ARCHS  CUDA archs of the build (default pyproject.toml's "80;86;89;90a")
#   USER_UID / USER_GID     the checkout owner's ids: the user `dev` gets them (also 0 for a
#                           root-owned checkout), so a bind-mounted checkout stays writable
# Build secret (optional): extra_ca, PEM certificates to trust while downloading, e.g. behind a
# TLS-re-signing proxy: `docker build --secret id=extra_ca,src=ca.pem`. Used only inside the steps
# that download (.ci/with-build-ca), never written to a layer.
#
# The kernels are compiled with the CUDA 13 nvcc wheels of locks/build.txt, as in CI (CUDA 13 code
# needs an R580+ driver); the uv cache is a temporary folder of the step that fills the venvs,
# removed in that step, so no layer holds it.

ARG BASE_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu22.04
FROM ${BASE_IMAGE} AS base

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python 3.11 (the locks' Python) from the base's own archive: Debian 12's default python3,
# Ubuntu 22.04's universe. g++ is nvcc's host compiler; git for editable installs.
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates \
        g++ \
        git \
        python3.11 \
        python3.11-dev \
        python3.11-venv \
    && rm -rf /var/lib/apt/lists/*

# `dev` has the checkout owner's ids, whatever they are (-o: uid 0 for a root-owned checkout).
ARG USER_UID=1000
ARG USER_GID=1000
RUN (getent group "${USER_GID}" >/dev/null || groupadd --gid "${USER_GID}" dev) \
    && useradd --non-unique --uid "${USER_UID}" --gid "${USER_GID}" --home-dir /home/dev \
        --shell /bin/bash dev \
    && mkdir -p /work /opt/bootstrap /opt/nox /opt/build /home/dev \
    && chown "${USER_UID}:${USER_GID}" /work /opt/bootstrap /opt/nox /opt/build /home/dev

# XLA_GPU_OPS_REUSE_VENVS: nox keeps the venvs made below instead of making them anew (they are
# still checked against the locks), so a container runs the sessions without a download.
# XLA_GPU_OPS_NOX_ENVDIR / XLA_GPU_OPS_BUILD_ROOT: where the noxfile puts venvs and CMake builds.
ENV HOME=/home/dev \
    PATH=/opt/bootstrap/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    UV_CACHE_DIR=/home/dev/.cache/uv \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON_PREFERENCE=only-system \
    XLA_GPU_OPS_REUSE_VENVS=1 \
    XLA_GPU_OPS_NOX_ENVDIR=/opt/nox \
    XLA_GPU_OPS_BUILD_ROOT=/opt/build

USER ${USER_UID}:${USER_GID}
WORKDIR /work

# Bootstrap: nox and uv, hash-checked, the same lock as README's first command.
COPY .ci/with-build-ca /usr/local/bin/with-build-ca
COPY --chown=${USER_UID}:${USER_GID} locks/bootstrap.txt /opt/bootstrap/bootstrap.txt
RUN --mount=type=secret,id=extra_ca,mode=0444 \
    python3.11 -m venv /opt/bootstrap \
    && with-build-ca /opt/bootstrap/bin/python -m pip install --no-cache-dir \
        --require-hashes -r /opt/bootstrap/bootstrap.txt

ARG XLA_GPU_OPS_CUDA_ARCHS="80;86;89;90a"
ENV XLA_GPU_OPS_CUDA_ARCHS=${XLA_GPU_OPS_CUDA_ARCHS}


FROM base AS runtime

COPY --chown=${USER_UID}:${USER_GID} . /work

# The venvs of `build`, `lint` and `tests`, made by nox from the locks in one step that shares,
# then removes, its uv cache. `tests` requires `build`, which compiles the kernels and installs
# libxla_gpu_ops.so; PYTEST_ADDOPTS makes pytest only collect here (no GPU during a build).
RUN --mount=type=secret,id=extra_ca,mode=0444 \
    export UV_CACHE_DIR=/tmp/uv-cache \
    && with-build-ca nox -s lint --install-only \
    && PYTEST_ADDOPTS="--collect-only -q" with-build-ca nox -s tests \
    && rm -rf /tmp/uv-cache

CMD ["nox", "-s", "lint", "tests"]


FROM runtime AS dev

# Editor tools for the dev container: clangd for the C++/CUDA sources (the VS Code extension
# cannot download one offline), gdb for host code (cuda-gdb comes with the CUDA devel base).
USER 0:0
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        clangd \
        gdb \
        less \
    && rm -rf /var/lib/apt/lists/*
USER ${USER_UID}:${USER_GID}

CMD ["sleep", "infinity"]


# torch 2.7.0 + torch_xla 2.7.0 + JAX's CUDA PJRT plugin (jax-cuda12-pjrt 0.5.3, PJRT C API 0.67),
# all from locks/xla-cuda.txt (docs/TORCH_XLA_GPU.md); the kernels built by `nox -s build`.
FROM base AS xla-cuda

COPY --chown=${USER_UID}:${USER_GID} . /work

RUN --mount=type=secret,id=extra_ca,mode=0444 \
    export UV_CACHE_DIR=/tmp/uv-cache \
    && PYTEST_ADDOPTS="--collect-only -q" with-build-ca nox -s xla_cuda \
    && rm -rf /tmp/uv-cache

CMD ["nox", "-s", "xla_cuda"]
