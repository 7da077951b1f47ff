# syntax=docker/dockerfile:1
# xla-gpu-ops image: the same locks and nox sessions as CI (.ci/run), nothing of its own.
#
#   docker build --target runtime -t xla-gpu-ops .      # stack + built kernels
#   docker build --target dev -t xla-gpu-ops:dev .      # + editor tools, for .devcontainer/
#   docker compose run --rm tests                       # what CI runs: nox -s lint tests xla_cuda
#
# Toolchain: the kernels are compiled by `nox -s build` with the CUDA 13 nvcc wheels from
# locks/build.txt, exactly like CI, so the image's libxla_gpu_ops.so is the one CI proves.
# CUDA 13 code needs an R580+ driver on the host. The CUDA 12.8 devel base still carries a system
# nvcc (/usr/local/cuda/bin) for hosts with older drivers; see docs/ENVIRONMENT.md.
# Build args:
#   XLA_GPU_OPS_CUDA_ARCHS  CUDA archs for `nox -s build` (noxfile default "80;86;89;90a";
#                           "90a" alone: one arch instead of four, for an H100/H200-only image)
#   USER_UID / USER_GID     uid/gid of the non-root user, to match the owner of a bind-mounted checkout

# Pinned by tag. No cuDNN flavour: torch and jax bring their own cuDNN wheels from the lock.
FROM nvidia/cuda:12.8.1-devel-ubuntu22.04 AS base

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python 3.11 is CI's Python (locks are compiled for it); Ubuntu 22.04 ships it in its own
# archive (python3.11, universe), signed like the rest of the base: no PPA, no download from
# outside the package registries. g++ is nvcc's host compiler; git for editable installs.
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

ARG USER_UID=1000
ARG USER_GID=1000
RUN groupadd --gid "${USER_GID}" dev \
    && useradd --uid "${USER_UID}" --gid "${USER_GID}" --create-home --shell /bin/bash dev \
    && mkdir -p /work /opt/bootstrap \
    && chown "${USER_UID}:${USER_GID}" /work /opt/bootstrap

ENV PATH=/opt/bootstrap/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_CACHE_DIR=/home/dev/.cache/uv \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON_PREFERENCE=only-system

USER ${USER_UID}:${USER_GID}
WORKDIR /work

# Bootstrap: nox and uv, hash-checked, the same step as .ci/run.
COPY --chown=${USER_UID}:${USER_GID} locks/bootstrap.txt /work/locks/bootstrap.txt
RUN python3.11 -m venv /opt/bootstrap \
    && /opt/bootstrap/bin/python -m pip install --no-cache-dir --require-hashes -r /work/locks/bootstrap.txt


FROM base AS runtime
ARG USER_UID=1000
ARG USER_GID=1000

# Locks before source: editing the package or the kernels never re-downloads the stack.
# This layer only fills uv's cache from the hash-locked files (no venv is kept); the session
# venvs themselves are made below by nox, from the same locks.
COPY --chown=${USER_UID}:${USER_GID} locks/ /work/locks/
RUN for lock in locks/build.txt locks/default.txt locks/lint.txt; do \
        uv venv --quiet --python 3.11 /tmp/cache-fill \
        && uv pip install --quiet --python /tmp/cache-fill --require-hashes -r "/work/${lock}" \
        && rm -rf /tmp/cache-fill \
        || exit 1; \
    done

COPY --chown=${USER_UID}:${USER_GID} . /work

# The same nox sessions as CI: `tests` requires `build`, which compiles the kernels and installs
# libxla_gpu_ops.so into xla_gpu_ops/_lib; `tests` then installs the default lock and the
# package. PYTEST_ADDOPTS makes pytest only collect here: there is no GPU during `docker build`.
ARG XLA_GPU_OPS_CUDA_ARCHS="80;86;89;90a"
ENV XLA_GPU_OPS_CUDA_ARCHS=${XLA_GPU_OPS_CUDA_ARCHS}
RUN PYTEST_ADDOPTS="--collect-only -q" nox -s tests

CMD ["nox", "-s", "lint", "tests"]


FROM runtime AS dev
ARG USER_UID=1000
ARG USER_GID=1000

# Editor tools for the dev container: clangd for the C++/CUDA extension (it cannot download one
# offline), gdb for host code (cuda-gdb comes with the devel base).
USER 0:0
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        clangd \
        gdb \
        less \
    && rm -rf /var/lib/apt/lists/*
USER ${USER_UID}:${USER_GID}

CMD ["sleep", "infinity"]


# ---------------------------------------------------------------------------------------------
# xla-cuda: torch_xla 2.7 on XLA:CUDA, the pinned legacy stack (docs/TORCH_XLA_GPU.md)
#
#   docker build --target xla-cuda -t xla-gpu-ops:xla-cuda .
#   docker compose run --rm tests-xla-cuda              # nox -s xla_cuda on the GPUs of the host
#
# torch 2.7.0 + torch_xla 2.7.0 + JAX's CUDA PJRT plugin (jax-cuda12-pjrt 0.5.3, PJRT C API 0.67),
# all from locks/xla-cuda.txt with hashes; the CUDA 12 libraries come as nvidia-*-cu12 wheels, so
# the base image's toolkit is not used at run time. The kernels are built by `nox -s build` from
# locks/build.txt, as in the runtime target.
# ---------------------------------------------------------------------------------------------
FROM base AS xla-cuda
ARG USER_UID=1000
ARG USER_GID=1000

# Locks before source, as in runtime: only uv's cache is filled here, nox makes the venvs.
COPY --chown=${USER_UID}:${USER_GID} locks/ /work/locks/
RUN for lock in locks/build.txt locks/xla-cuda.txt; do \
        uv venv --quiet --python 3.11 /tmp/cache-fill \
        && uv pip install --quiet --python /tmp/cache-fill --require-hashes -r "/work/${lock}" \
        && rm -rf /tmp/cache-fill \
        || exit 1; \
    done

COPY --chown=${USER_UID}:${USER_GID} . /work

# Builds the kernels and the session's venv; pytest only collects (no GPU during `docker build`).
ARG XLA_GPU_OPS_CUDA_ARCHS="80;86;89;90a"
ENV XLA_GPU_OPS_CUDA_ARCHS=${XLA_GPU_OPS_CUDA_ARCHS}
RUN PYTEST_ADDOPTS="--collect-only -q" nox -s xla_cuda

CMD ["nox", "-s", "xla_cuda"]
