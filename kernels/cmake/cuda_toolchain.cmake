# The CUDA compiler, chosen in one place for every way of building: `pip install .` and
# `nox -s build` (both through scikit-build-core) and a plain `cmake -S kernels`.
#
#   -DCMAKE_CUDA_COMPILER=...   wins when given;
#   XLA_GPU_OPS_NVCC=/path/nvcc a named system nvcc (e.g. CUDA 12.x for drivers older than R580);
#   otherwise                   the CUDA 13 nvcc wheel (nvidia-cuda-nvcc, pinned in locks/build.txt
#                               and pyproject.toml) importable by the Python that runs the build.
#
# Included by CMakeLists.txt after project() enabled C++ and before enable_language(CUDA).

if(NOT CMAKE_CUDA_COMPILER)
  if(NOT "$ENV{XLA_GPU_OPS_NVCC}" STREQUAL "")
    set(CMAKE_CUDA_COMPILER "$ENV{XLA_GPU_OPS_NVCC}")
  else()
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
        "import pathlib, sys; print(next((str(p) for p in (pathlib.Path(d, 'nvidia', 'cu13') for d in sys.path) if (p / 'bin' / 'nvcc').is_file()), ''))"
      OUTPUT_VARIABLE XLA_GPU_OPS_CUDA_WHEEL OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
    if(NOT XLA_GPU_OPS_CUDA_WHEEL)
      message(FATAL_ERROR
        "No CUDA compiler: ${Python3_EXECUTABLE} finds no nvidia-cuda-nvcc wheel (nvidia/cu13/bin/nvcc). "
        "Install the build lock (locks/build.txt), or name a system nvcc with XLA_GPU_OPS_NVCC=/path/to/nvcc.")
    endif()
    set(CMAKE_CUDA_COMPILER "${XLA_GPU_OPS_CUDA_WHEEL}/bin/nvcc")
  endif()
endif()

# The wheel keeps its static cudart in lib/ while its nvcc.profile points at lib64/: name the
# directory for CMake's compiler checks (LIBRARY_PATH, this configure only) and for the link.
if(CMAKE_CUDA_COMPILER MATCHES "/nvidia/cu13/bin/nvcc$")
  get_filename_component(_xgo_cuda_wheel_lib "${CMAKE_CUDA_COMPILER}/../../lib" ABSOLUTE)
  set(ENV{LIBRARY_PATH} "${_xgo_cuda_wheel_lib}:$ENV{LIBRARY_PATH}")
  link_directories("${_xgo_cuda_wheel_lib}")
endif()
message(STATUS "CUDA compiler: ${CMAKE_CUDA_COMPILER}")
