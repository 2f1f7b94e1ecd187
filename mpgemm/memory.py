"""The device memory mpgemm's CUDA launchers take beyond their outputs.

Some launches need a workspace: split-K GEMMs their fp32 partial sums
(split_k x M x N x 4 bytes, ``mpgemm.gemm_plan(...).workspace_bytes``),
GEMMs on padded operands (``MPGEMM_PADDED_OPERANDS=1``) copies of the
operands with aligned pitches (their own size, rows and columns rounded up
to 8),
wgrad its split's fp32 partial sums (splits x the filters' elements x 4
bytes), convolutions whose channels per group are not whole chunks their
zero-padded copies of the operands and the output. Each comes from torch's
caching allocator for the call alone: it counts in
``torch.cuda.max_memory_allocated`` and goes back to the allocator when the
call returns. Splits aim at filling the device, so the partial sums are
bounded by the device's size, not the problem's: a GEMM splits only when its
tiles fill at most half the multiprocessors, into at most ceil(multiprocessors
/ tiles) parts, so its partials hold at most 1.5 x multiprocessors tiles of
fp32 (a tuned plan at most 16 x M x N x 4 bytes; on the Hopper block,
where its cost model says the split pays (``MPGEMM_WGMMA_SPLIT_K``), at
most 16 ways and 4 x multiprocessors tiles plus one split's: 16.5 MB for
GPT-2 small's 768 x 768 weight gradient split 7 ways; stream-K,
``MPGEMM_STREAM_K=1``, an fp32 tile of its plan per block of the grid, at
most one per multiprocessor: 16.5 MiB on 132 for 128 x 256 tiles, 8.3 and
4.1 MiB for the narrow 128 x 128 and 128 x 64); wgrad splits as a cost
model of its mainloop and partials' traffic says is fastest, its partials at
most 4 x multiprocessors + its own tiles. These counters say how much a run took.
"""

from . import _C


def workspace_stats():
    """The workspaces taken since the process started or the last
    :func:`reset_workspace_stats`: a dict with ``calls`` (launches that took
    one), ``bytes`` (all of them) and ``largest_bytes`` (the largest one call
    took). Zero on a CPU build, whose reference backend takes none."""
    return dict(_C.workspace_stats())


def reset_workspace_stats():
    """Zeroes the counts :func:`workspace_stats` returns."""
    _C.reset_workspace_stats()
