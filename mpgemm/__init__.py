"""mpgemm: mixed-precision matrix products on Tensor Cores through WMMA.

fp16 inputs, products accumulated in fp32, with a CPU reference backend that
has the kernels' exact semantics.
"""

import torch

from . import _C  # noqa: F401  (loading the library registers the torch.ops.mpgemm ops)
from ._build import build_info
from .ops import gemm

__version__ = "0.1.0"
__all__ = ["build_info", "gemm"]
