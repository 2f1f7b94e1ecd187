"""Mixed-precision training: fp16 weights and activations, fp32 master
weights, dynamic loss scaling, products accumulated in fp32 on Tensor Cores."""

from .master import MasterWeightOptimizer
from .prepare import prepare
from .range_check import fp16_range_check
from .scaler import LossScaler

__all__ = ["LossScaler", "MasterWeightOptimizer", "fp16_range_check", "prepare"]
