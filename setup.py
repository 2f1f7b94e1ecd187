"""Builds mpgemm._C: the CUDA extension (CPU reference plus WMMA kernels) when
torch is a CUDA build and a CUDA compiler is found, otherwise the CPU-only one.

TORCH_CUDA_ARCH_LIST is honoured. With no list and no GPU visible, the kernels
are built for every Tensor Core arch mpgemm supports (DEFAULT_CUDA_ARCHS).
MPGEMM_FORCE_CPU=1 builds the CPU-only extension even where CUDA is available.
"""

import os
import re

import torch
from setuptools import setup
from torch.utils import cpp_extension

DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;8.9;9.0"
CPU_SOURCES = ["csrc/ops.cpp", "csrc/autocast.cpp", "csrc/checks.cpp", "csrc/conv_cpu.cpp", "csrc/gemm_cpu.cpp", "csrc/unscale_cpu.cpp",
               "csrc/gemm_plan_py.cpp", "csrc/kernels/gemm_plan.cpp"]
CUDA_SOURCES = [
    "csrc/cuda/conv_cuda.cpp",
    "csrc/cuda/cublas_baseline.cpp",
    "csrc/cuda/gemm_cuda.cpp",
    "csrc/cuda/mma_ceiling_cuda.cpp",
    "csrc/cuda/unscale_cuda.cpp",
    "csrc/kernels/conv_depthwise.cu",
    "csrc/kernels/conv_launch.cu",
    "csrc/kernels/gemm_launch.cu",
    "csrc/kernels/gemm_tile_compact.cu",
    "csrc/kernels/gemm_tile_scalar.cu",
    "csrc/kernels/gemm_tile_small.cu",
    "csrc/kernels/gemm_tile_square.cu",
    "csrc/kernels/gemm_tile_tall.cu",
    "csrc/kernels/gemm_tile_wide.cu",
    "csrc/kernels/gemm_wgmma.cu",
    "csrc/kernels/gemm_wgmma_kk.cu",
    "csrc/kernels/gemm_wgmma_kk_2x1.cu",
    "csrc/kernels/gemm_wgmma_kk_pingpong.cu",
    "csrc/kernels/gemm_wgmma_km.cu",
    "csrc/kernels/gemm_wgmma_km_2x1.cu",
    "csrc/kernels/gemm_wgmma_km_pingpong.cu",
    "csrc/kernels/gemm_wgmma_mk.cu",
    "csrc/kernels/gemm_wgmma_mk_2x1.cu",
    "csrc/kernels/gemm_wgmma_mk_pingpong.cu",
    "csrc/kernels/gemm_wgmma_mm.cu",
    "csrc/kernels/gemm_wgmma_mm_2x1.cu",
    "csrc/kernels/gemm_wgmma_mm_pingpong.cu",
    "csrc/kernels/mma_ceiling.cu",
    "csrc/kernels/padded_copy.cu",
    "csrc/kernels/splitk_reduce.cu",
    "csrc/kernels/unscale.cu",
]


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
    cxx = ["-O3", define("MPGEMM_TORCH_VERSION", torch.__version__)]
    if not build_cuda():
        return cpp_extension.CppExtension(
            "mpgemm._C", CPU_SOURCES, extra_compile_args={"cxx": cxx + [define("MPGEMM_BUILD_BACKEND", "cpu")]}
        )
    cxx += [
        "-DMPGEMM_WITH_CUDA",
        define("MPGEMM_BUILD_BACKEND", "cuda"),
        define("MPGEMM_CUDA_ARCHS", ",".join(cuda_archs())),
        define("MPGEMM_CUDA_VERSION", torch.version.cuda),
    ]
    return cpp_extension.CUDAExtension(
        "mpgemm._C",
        CPU_SOURCES + CUDA_SOURCES,
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-Xptxas=-warn-spills"]},
    )


setup(
    packages=["mpgemm", "mpgemm.amp", "mpgemm.tools"],
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
