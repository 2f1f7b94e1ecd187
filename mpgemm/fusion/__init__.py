"""Fusions across layers (:func:`fuse`): a ResNet's conv -> batch norm
(-> residual add) (-> ReLU) chains on mpgemm's batch-norm passes, a
transformer's linear -> GELU or ReLU -> linear blocks as one mpgemm.mlp, and
its gated MLP blocks (Llama's SwiGLU, Gemma's GeGLU) as one
mpgemm.gated_mlp."""

from .batch_norm import batch_norm_act
from .fuse import fuse, fusion_report

__all__ = ["batch_norm_act", "fuse", "fusion_report"]
