"""Builds mpgemm._C: the CUDA extension (CPU reference plus WMMA kernels) when
torch is a CUDA build and a CUDA compiler is found, otherwise the CPU-only one.

TORCH_CUDA_ARCH_LIST is honoured. With no list and no GPU visible, the kernels
are built for every Tensor Core arch mpgemm supports (DEFAULT_CUDA_ARCHS).
MPGEMM_FORCE_CPU=1 builds the CPU-only extension even where CUDA is available.
"""

import glob
import os
import re

import torch
from setuptools import setup
from torch.utils import cpp_extension

DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;8.9;9.0"
# ptxas --split-compile=0 compiles a unit's kernels on as many threads as
# the machine has cores, so that a unit of several kernels (every WMMA tile,
# the Hopper kernels of one tile and type) builds about as fast as its
# slowest where cores allow; the code it makes is the same (bench/NOTES.md).
NVCC_FLAGS = ["-O3", "-Xptxas=-warn-spills", "-Xptxas=--split-compile=0"]
KERNELS = "csrc/kernels"


def sources(pattern):
    return sorted(glob.glob(pattern, recursive=True))


# The host-side plan (csrc/kernels/plan) is plain C++ that the CPU build runs too.
CPU_SOURCES = sources("csrc/*.cpp") + sources(f"{KERNELS}/plan/*.cpp")
# The GEMM kernels' units first, the WMMA tiles' (the longest) before the
# Hopper ones: a parallel build that starts on them ends on short units, not
# on one of them (BuildExtension keeps this order, which distutils would sort
# by name).
CUDA_SOURCES = sorted(sources(f"{KERNELS}/**/*.cu") + sources("csrc/cuda/*.cpp"),
                      key=lambda path: (not path.startswith(f"{KERNELS}/wmma/"),
                                        not path.startswith(f"{KERNELS}/sm90/")))


def build_cuda():
    if os.environ.get("MPGEMM_FORCE_CPU") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def cuda_archs():
    """The sm_XY targets nvcc will build, read from torch's own arch flags.
    Hopper (9.0) is built as sm_90a, whose code alone has wgmma and setmaxnreg
    (the Hopper GEMM path) and which runs on every 9.0 device."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        if torch.cuda.is_available():
            archs = ";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i)
                                     for i in range(torch.cuda.device_count())}))
        else:
            archs = DEFAULT_CUDA_ARCHS
    os.environ["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(?<![\d.])9\.0(?![\da-z])", "9.0a", archs.replace(" ", ";"))
    flags = cpp_extension._get_cuda_arch_flags()
    return sorted({f"sm_{m}" for flag in flags for m in re.findall(r"code=(?:sm|compute)_(\d+a?)", flag)})


def define(name, value):
    return f'-D{name}="{value}"'


def extension():
    # AT_PER_OPERATOR_HEADERS: torch's headers include the op headers they
    # use (ATen/ops/<op>.h), as the host units do, not ATen/Functions.h with
    # every op's declarations (7.8 s to parse alone, against 2.0 s for
    # ATen/core/Tensor.h).
    # No FMA contraction on the host: the CPU backends round each step as the kernels do
    # (csrc/kernels/norm/layer_norm_math.h), whatever the host's instructions.
    cxx = ["-O3", "-ffp-contract=off", "-DAT_PER_OPERATOR_HEADERS",
           define("MPGEMM_TORCH_VERSION", torch.__version__)]
    if not build_cuda():
        return cpp_extension.CppExtension(
            "mpgemm._C", CPU_SOURCES, include_dirs=[os.path.abspath(KERNELS)],
            extra_compile_args={"cxx": cxx + [define("MPGEMM_BUILD_BACKEND", "cpu")]}
        )
    cxx += [
        "-DMPGEMM_WITH_CUDA",
        define("MPGEMM_BUILD_BACKEND", "cuda"),
        define("MPGEMM_CUDA_ARCHS", ",".join(cuda_archs())),
        define("MPGEMM_CUDA_VERSION", torch.version.cuda),
    ]
    return cpp_extension.CUDAExtension(
        "mpgemm._C",
        CUDA_SOURCES + CPU_SOURCES,
        include_dirs=[os.path.abspath(KERNELS)],
        extra_compile_args={"cxx": cxx, "nvcc": NVCC_FLAGS},
    )


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build, compiling an extension's sources in the order it lists
    them, not in the order of their names."""

    def build_extension(self, ext):
        compile_sources = self.compiler.compile  # torch's ninja build, once build_extensions has set it
        position = {source: i for i, source in enumerate(ext.sources)}

        def compile_in_listed_order(sources, *args, **kwargs):
            return compile_sources(sorted(sources, key=lambda s: position.get(s, len(position))), *args, **kwargs)

        self.compiler.compile = compile_in_listed_order
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = compile_sources


setup(
    packages=["mpgemm", "mpgemm.amp", "mpgemm.tools"],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
)
