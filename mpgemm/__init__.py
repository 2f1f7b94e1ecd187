"""mpgemm: mixed-precision matrix products on Tensor Cores through WMMA.

fp16 inputs, products accumulated in fp32, with a CPU reference backend that
has the kernels' exact semantics.
"""

import torch

from . import _C  # noqa: F401  (loading the library registers the torch.ops.mpgemm ops)
from . import amp, nn
from . import autograd  # noqa: F401  (registers the backward formulas)
from ._build import build_info
from .convert import convert, converted_layers
from .ops import conv2d, gemm, linear

__version__ = "0.1.0"
__all__ = ["amp", "build_info", "conv2d", "convert", "converted_layers", "gemm", "linear", "nn"]
