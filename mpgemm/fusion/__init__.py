"""Fusions across layers (:func:`fuse`): a ResNet's conv -> batch norm
(-> residual add) (-> ReLU) chains on mpgemm's batch-norm passes (the
stem's max pool in its chain's pass, with MPGEMM_FUSED_MAX_POOL=1), a
transformer's linear -> GELU or ReLU -> linear blocks as one mpgemm.mlp, and
its gated MLP blocks (Llama's SwiGLU, Gemma's GeGLU) as one
mpgemm.gated_mlp."""

from .batch_norm import batch_norm_act, batch_norm_relu_max_pool
from .fuse import fuse, fusion_report

__all__ = ["batch_norm_act", "batch_norm_relu_max_pool", "fuse", "fusion_report"]
