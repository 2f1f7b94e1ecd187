"""Fusions across layers: a ResNet's conv -> batch norm (-> residual add)
(-> ReLU) chains on mpgemm's batch-norm passes (:func:`fuse`)."""

from .batch_norm import batch_norm_act
from .fuse import fuse, fusion_report

__all__ = ["batch_norm_act", "fuse", "fusion_report"]
