"""Build of the bundled HiSparse kernels (torch C++/CUDA extension on the torch stable ABI).

Environment:
  HISPARSE_BUILD_CUDA=1   also compile the CUDA kernels (needs nvcc and a CUDA build of torch);
                          otherwise the library has the CPU kernels only.
  TORCH_CUDA_ARCH_LIST    CUDA architectures (torch's own variable), e.g. "9.0" for H100/H200.

The sha256 of the build inputs (same rule as the harness's `source_hash`) and the version
are compiled into the library, so a running process reports what it actually loaded.
`python -m hisparse_kernels.build` builds the same library without pip or setuptools (see there).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
# Flags, build inputs and the source hash live in hisparse_kernels/build.py (the build without
# setuptools), loaded by path so that this file imports no package before torch's own.
_spec = importlib.util.spec_from_file_location("hisparse_kernels_build", HERE / "hisparse_kernels" / "build.py")
direct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(direct)


def write_build_info(build_cuda: bool) -> Path:
    folder = HERE / "build" / "generated"
    folder.mkdir(parents=True, exist_ok=True)
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "native") if build_cuda else None
    (folder / "hisparse_build_info.h").write_text(direct.build_info_header(HERE, arch), encoding="utf-8")
    return folder


def extension():
    build_cuda = os.environ.get("HISPARSE_BUILD_CUDA", "0") == "1"
    include_dirs = [str(HERE / "csrc"), str(write_build_info(build_cuda))]
    cxx = list(direct.CXX_FLAGS)
    sources = list(direct.CPU_SOURCES)
    if not build_cuda:
        return CppExtension("hisparse_kernels._C", sources, include_dirs=include_dirs,
                            extra_compile_args={"cxx": cxx}, py_limited_api=True)
    defines = list(direct.CUDA_DEFINES)
    return CUDAExtension("hisparse_kernels._C", [*sources, *direct.CUDA_SOURCES],
                         include_dirs=include_dirs, py_limited_api=True,
                         extra_compile_args={"cxx": cxx + defines, "nvcc": [*direct.NVCC_FLAGS, *defines]})


setup(
    version=direct.version(HERE),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
