"""What the loaded extension was built with."""

import torch

from . import _C


def build_info():
    """Describes the compiled extension.

    Returns a dict with:
      backend: "cuda" (WMMA kernels plus the CPU reference) or "cpu" (reference only);
      cuda_archs: the sm_XY targets compiled in (empty for a CPU build);
      cuda_version: the CUDA version built against (empty for a CPU build);
      torch_version: the torch version built against;
      mma_ceiling: the shapes of the mma.sync ceiling kernel (`bench ceiling`):
        warps per block and the warp tile warp_m x warp_n x k;
      torch_runtime_version: the torch version running now;
      cuda_available: whether a GPU is usable now.
    """
    info = dict(_C.build_info())
    info["cuda_archs"] = [arch for arch in info["cuda_archs"].split(",") if arch]
    info["torch_runtime_version"] = torch.__version__
    info["cuda_available"] = info["backend"] == "cuda" and torch.cuda.is_available()
    return info
