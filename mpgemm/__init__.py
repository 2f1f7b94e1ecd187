"""mpgemm: mixed-precision matrix products on Tensor Cores through WMMA.

fp16 inputs, products accumulated in fp32, with a CPU reference backend that
has the kernels' exact semantics.
"""

import torch

from . import _C  # noqa: F401  (loading the library registers the torch.ops.mpgemm ops and their autograd)
from . import amp, nn
from ._build import build_info
from .convert import convert, converted_layers
from .fusion import fuse, fusion_report
from .memory import reset_workspace_stats, workspace_stats
from .ops import conv2d, gated_mlp, gemm, layer_norm, linear, mlp
from .plan import clear_tuning_cache, gemm_plan, load_tuning, tile_configs


def tune_gemm(shapes, **kwargs):
    """Times every candidate plan of each shape and caches the fastest per
    device (mpgemm.tools.tuning.tune_gemm); returns the chosen entries."""
    from .tools.tuning import tune_gemm as tune

    return tune(shapes, **kwargs)


__version__ = "0.1.0"
__all__ = ["amp", "build_info", "clear_tuning_cache", "conv2d", "convert", "converted_layers", "fuse", "fusion_report",
           "gated_mlp", "gemm", "gemm_plan", "layer_norm", "linear", "load_tuning", "mlp", "nn", "reset_workspace_stats",
           "tile_configs", "tune_gemm", "workspace_stats"]
