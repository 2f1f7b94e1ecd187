"""Kernel simulation: g++ compiles the CUDA kernels of csrc/kernels against the
stand-in CUDA headers of kernel_sim/mock and the simulation's own instruction
layer (kernel_sim/arch, found ahead of csrc/kernels/arch on the include path),
and runs random GEMM (every tile of common/tile_configs.h, split-K, grouped
tile orders), unscale, convolution (fprop, dgrad, wgrad; depthwise wgrad
on the sliding window too; fprop and dgrad of at most 16 filters or
channels per group on the 128 x 16 tile too), mma.sync ceiling
and batch-norm (mpgemm.fuse's passes: kernel_sim/batch_norm_cases.cpp; a
row block's partial sums dropped and a row summed twice must be caught)
problems on the host, with fp16 and bf16 inputs (bf16 from sim arch 800 on;
below it launches must be refused), every CUDA thread a fiber of the
launching thread that runs until it waits (kernel_sim/mock/fibers.h), under
AddressSanitizer and UBSan, checking each output against a reference. No GPU
and no nvcc needed, so the kernels' indexing, bounds, zero-fill and
synchronization are tested wherever the tests run. See kernel_sim/driver.cpp
and conv_cases.cpp.

1x1 convolutions at stride 1 without padding run as GEMMs too, as
MPGEMM_CONV_PATH=gemm asks (kernel_sim/conv_gemm_cases.cpp), on the WMMA
tiles and at sim arch 900 on the Hopper GEMM.

At sim arch 900 the Hopper GEMM (wgmma, the tensor copy engine's loads and
stores, mbarriers, named barriers) runs on models of those instructions
written from the PTX ISA (kernel_sim/hopper_models.h, hopper_sim.h), with
copies, stores and wgmmas completing early or late; its index code is checked
against the models element by element, and planted pipeline and epilogue bugs
must be caught; the narrow tiles (128 x 128 and 128 x 64, deeper rings) run
there, forced and as the default picks them. The Hopper convolution
(fprop, dgrad, with a stride one launch per phase, wgrad) runs there too,
on the wide tile (MPGEMM_NARROW_TILES=0) and the narrow ones, strided dgrad
with its rows from registers (MPGEMM_STAGED_ROW_STORES=0) and staged
through shared memory, a launch a phase (MPGEMM_DGRAD_ONE_LAUNCH=0) or all
its phases in one launch (the default), and few-channel fprop and wgrad on
copies with their taps folded into the channels (conv/folded_taps.h; x
folded a thread per element, MPGEMM_CHUNKED_FOLD=0, or per 16 bytes, the
default, both also
checked on their own against the fold's definition; or the fold gathered
by the producer's threads, MPGEMM_GATHERED_FOLD=1), its im2col copies
placed by the model of the PTX ISA's im2col mode, which is checked against
the convolution's own windows.
Ordinary shared-memory accesses between threads are checked against the
named barriers between them. A wrong filter offset, a wrong bounding-box
corner, dgrad's filters unflipped, a strided dgrad's phases stored to the
wrong pixels, wgrad's splits summing the same pixels, a stage handed back
early, a narrow tile's filters copied in the wide tile's boxes, a staged
strip read back before its warpgroup has met, one launch's tiles given to
the phase before theirs or walking another phase's taps, its phases no
tap reaches left out, x's fold in chunks reading past x's last column,
and the gathered fold's stores left unfenced or read from the wrong run
must be caught, and wgrad's split counts for ResNet-50 on 132
multiprocessors must be the cost model's (plan/split_cost.h). See kernel_sim/hopper_cases.cpp and
hopper_conv_cases.cpp."""

import concurrent.futures
import glob
import os
import re
import shutil
import subprocess

import pytest

from support import ROOT, SEED, skip_or_fail

SIM_DIR = os.path.join(ROOT, "tests", "kernels", "kernel_sim")
KERNEL_DIR = os.path.join(ROOT, "csrc", "kernels")
MOCK_DIR = os.path.join(SIM_DIR, "mock")
# The stand-in CUDA headers, which every unit reads precompiled.
CUDA_HEADERS = os.path.join(MOCK_DIR, "cuda_headers.h")


def host_has_f16c():
    """Whether this machine's CPU converts fp16 itself (F16C, which comes with AVX)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and {"avx", "f16c"} <= set(line.split()) for line in f)
    except OSError:
        return False


# -g1: line tables for the sanitizers' reports, a third faster to build than -g.
# -Wno-psabi: the note that GCC 4.6 changed how 64-byte aligned arguments (CUtensorMap) pass.
# -mf16c where the host has it: the mock's _Float16 converted by one
# instruction (IEEE, to nearest even, as libgcc's call, which was an eighth
# of a Hopper run).
BASE_CXXFLAGS = ["-std=c++20", "-O1", "-g1", "-pthread", "-Wno-psabi"] + (["-mf16c"] if host_has_f16c() else [])
# AddressSanitizer without its use-after-scope checks, which poison and
# unpoison each local at every scope it lives in and cost a quarter of the
# compile (the WMMA tiles' unit at sim arch 800: 73 s of user CPU with
# them, 54 s without). The kernels keep no pointer to a local past its
# scope (the wgmma model's pointer to a kernel's accumulators lives no
# longer than they, the whole kernel); out-of-bounds accesses and use after
# free, what the kernels' index code can get wrong, are still caught.
ADDRESS_SANITIZER = ["-fsanitize=address", "-fno-sanitize-address-use-after-scope"]
# UBSan but for the checks that say nothing about the kernels' code and
# cost another quarter (that unit: 54 to 39 s): vptr (no polymorphic
# types), null (a null dereference crashes, and AddressSanitizer reports
# it), object-size (AddressSanitizer's redzones catch what it would) and
# pointer-overflow (only arithmetic that wraps the address space).
# Alignment, bounds, shifts, signed overflow, division by zero, enums and
# bools stay.
CXXFLAGS = BASE_CXXFLAGS + ADDRESS_SANITIZER + [
    "-fsanitize=undefined", "-fno-sanitize=vptr,null,object-size,pointer-overflow", "-fno-sanitize-recover=all"]
# A planted bug's unit: the simulation's checks, its reference and
# AddressSanitizer catch what is planted, so it builds without UBSan
# (linked first, its copies of code it shares with the other units are the
# ones that binary runs).
PLANTED_CXXFLAGS = BASE_CXXFLAGS + ADDRESS_SANITIZER
# CI has two cores, on which the whole module takes about 3.5 minutes, most
# of it building (bench/NOTES.md, "The simulation's units").
WORKERS = 2
GEMM_CASES = 60
UNSCALE_CASES = 20
BATCH_NORM_CASES = 12
# Case i is pass i % 3 on load path i / 3 % 7 in element type i / 21 % 2 (fp16,
# bf16), so every 42 cases run all 26 implicit-GEMM conv kernels (fprop and
# dgrad on three tiles at 16-byte chunks and two at 8-byte ones, wgrad on the
# large and compact tiles at 16-byte chunks and the compact at 8-byte ones),
# the padded copy's two (2- and 4-byte elements) and the depthwise kernels' 8
# (gather and wgrad, at 8 channels a thread and at one); sm_75 runs the 14
# fp16 ones (no large tile there) and the copy's two.
CONV_CASES = 84
CONV_KERNELS = {750: 16, 800: 36}
# Depthwise wgrad on the sliding window (MPGEMM_DEPTHWISE_SLIDING_WGRAD=1,
# conv_cases.cpp): 12 cases after the convolution's, one kernel each (filter
# rows of 3, 5 or 7 taps at column stride 1 or 2, fp16 and bf16; fp16 alone
# at sm_75), three of them split (one on a clipped grid, striding over
# splits and channel tiles), and its switch's plans and bad value.
SLIDING_KERNELS = {750: 6, 800: 12}
# The depthwise gather on the sliding window (MPGEMM_DEPTHWISE_SLIDING_GATHER=1,
# conv_cases.cpp): 18 cases after the 128 x 16 tile's, one kernel each
# (filter rows of 3, 5 or 7 taps, fprop at column stride 1 or 2 and dgrad,
# fp16 and bf16; fp16 alone at sm_75), each also run with the switch off
# (the gather kernel, whose bits it must give), four of them on two tiles of
# lanes and five on a clipped grid; its switch's plans and bad value, and
# plans forced to allow the window on geometries they had not.
GATHER_KERNELS = {750: 9, 800: 18}
# The 128 x 16 tile (MPGEMM_CONV_N16_TILE=1, conv_cases.cpp): 16 cases after
# the sliding window's, fprop and dgrad with at most 16 filters or channels
# per group, in place on 16- and 8-byte chunks (fprop also with its column
# moments) and on the padded copy, a first layer's dgrad among them, its
# switch's plans and bad value; its 10 kernels (fp16 and bf16) at sim arch
# 800. At 750, below the tile's arch, the plans give the same cases to the
# other tiles.
N16_KERNELS = 10
# (arch, cp.async copies land only when waited for). sm_75 has only the
# register-staged mainloop; sm_80 adds the cp.async pipeline, run with copies
# landing at issue and as late as wait_group allows.
RUNS = [(750, False), (800, False), (800, True)]
FIXED_SEEDS = {run: 1 + i for i, run in enumerate(RUNS)}
# The bugs planted in one WMMA tile's kernels (wmma/block.cuh; built from
# kernel_sim/wmma_planted.cpp), each of which must fail: a pipeline that
# waits for one cp.async group too few, and the column moments of a block's
# first warp row left out of its total (fprop's epilogue moments: run on the
# driver's first fp16 fprop on SmallTile past the two rounds that run
# without moments, case 48, alone).
WMMA_MUTATIONS = {
    "an early read of a pipeline stage": ("cp_async_wait<kStages - 2>()",
                                          "(PLANTED ? cp_async_wait<kStages - 1>() : cp_async_wait<kStages - 2>())"),
    "a warp row's column moments dropped": ("for (int w = 0; w < Tile::kWarpsM; ++w) {",
                                            "for (int w = PLANTED; w < Tile::kWarpsM; ++w) {"),
}
# The bugs planted in depthwise wgrad's sliding window
# (conv/depthwise_sliding_wgrad.cuh; its fp16 kernels in the same mutant
# build, kernel_sim/wmma_planted.cpp), each run on the cases after
# conv_case's alone (the 12 sliding wgrad cases, the 128 x 16 tile's and the
# sliding gather's, which must pass), and each of which must fail the first: every new column read one column to the
# left (a tap's products from its neighbour's column), and the first pixel
# lane's sums left out of the block's.
SLIDING_MUTATIONS = {
    "a sliding window's new column one to the left": (
        "(b + 1) * kStrideW - a.pad_left + kS - kStrideW + t,",
        "(b + 1) * kStrideW - a.pad_left + kS - kStrideW + t - PLANTED,"),
    "a sliding window's first pixel lane dropped": (
        "for (int pl = 0; pl < a.pixel_lanes; ++pl)",
        "for (int pl = PLANTED; pl < a.pixel_lanes; ++pl)"),
}
# The bugs planted in the depthwise gather's sliding window
# (conv/depthwise_sliding_gather.cuh; its fp16 kernels in the same mutant
# build), each run on the cases after conv_case's alone and each of which
# must fail the gather's (and leave the sliding wgrad's alone), with the
# message each names: the window's columns read one
# to the right (every fprop and dgrad product from its neighbour's pixel),
# dgrad's filter row read forwards (each tap against another's column,
# dgrad alone), and the filter rows summed last to first (the same products
# in another order: right on exact inputs, other bits than the gather
# kernel's on inputs whose sums round).
GATHER_MUTATIONS = {
    "a sliding gather's window one column to the right": (
        "const int col = first_col + c;",
        "const int col = first_col + c + PLANTED;", "out["),
    "a sliding gather's reversed row read forwards": (
        "(kTapW == 1 ? j : kTaps - 1 - j)",
        "(kTapW == 1 || PLANTED ? j : kTaps - 1 - j)", "out["),
    "a sliding gather's filter rows summed last to first": (
        "for (int i = 0; i < g.taps_r; ++i) {",
        "for (int i_ = 0, i = 0; i_ < g.taps_r; ++i_) { i = PLANTED ? g.taps_r - 1 - i_ : i_;",
        "not the gather kernel's bits"),
}
# The bug planted in dgrad's filter loads (conv/iterators.cuh's
# PhaseFilterLoader; the 128 x 16 tile's fp16 kernels in the same mutant
# build), run on the 128 x 16 tile's cases alone (with the sliding
# window's, which it leaves alone) and which must fail them: each thread's
# filter chunks past its first row of the K slice left zero, which the tile
# at 8-byte chunks (two rows a thread) multiplies wherever a tap has more
# than 32 output channels (case 9 always). The pipeline's early read
# (WMMA_MUTATIONS) is run on those cases alone too.
N16_MUTATIONS = {
    "dgrad's filter chunks past a thread's first row left out": (
        "valid = !column_in ? 0 : rows < Copy::kPerThread ? rows : Copy::kPerThread;",
        "valid = !column_in ? 0 : PLANTED ? (rows < 1 ? rows : 1) : rows < Copy::kPerThread ? rows : Copy::kPerThread;"),
}
# Planted bugs: each a text of csrc/kernels and what replaces it, in which
# PLANTED is true in a run that plants that bug (SIM_PLANTED_BUG, read by
# sim::planted in mock/cuda_runtime.h) and false otherwise, so that the bugs
# planted in one kernel share its build and each run plants one. A bug the
# run cannot choose (a type: no PLANTED in its text) has a build of its own.
#
# In the batch-norm sums (norm/batch_norm_kernels.cuh) and the totals of an
# epilogue's column moments (norm/column_moments.cu), each of which must
# fail the batch-norm cases: the last row block's partial sums dropped, each
# row block summing its predecessor's last row again, a block's moments
# dropped from the mean (each split's last, and the last split), each
# block's mean taken from the block after it (the next block counted twice),
# and every split of the blocks totalling the first split's (wrong only
# where there are several); in the loads-ahead kernels
# (norm/batch_norm_ahead_kernels.cuh, every other case), the last row of
# each group fetched ahead fetched but never used (its sums and input
# gradient left out), and the ReLU's byte of bits read unshifted (wrong
# wherever a run's bits do not start the byte: fp32 runs of 4 and runs of
# one); in the stem's fused max pool (norm/max_pool_kernels.cuh), ties won
# by the window's last tap instead of its first, and each input pixel's last
# covering window (by row and by column) left out of its gradient.
BATCH_NORM_FILES = ["norm/batch_norm_kernels.cuh", "norm/batch_norm_ahead_kernels.cuh", "norm/column_moments.cu",
                    "norm/max_pool_kernels.cuh", "norm/batch_norm_line_finish.cuh", "gated/gated.cu",
                    "norm/layer_norm.cu"]
BATCH_NORM_MUTATIONS = {
    "a row block's partial sums dropped": ("for (int64_t b = threadIdx.x; b < a.blocks; b += kThreads)",
                                           "for (int64_t b = threadIdx.x; b + PLANTED < a.blocks; b += kThreads)"),
    "a row summed twice": ("const int64_t begin = blockIdx.y * a.block_rows;",
                           "const int64_t begin = blockIdx.y * a.block_rows - (PLANTED && blockIdx.y > 0);"),
    "a block's moments dropped": ("for (int64_t g = first + warp; g < end; g += kWarps) weighted",
                                  "for (int64_t g = first + warp; g + PLANTED < end; g += kWarps) weighted"),
    "every split totalling the first split's blocks": (
        "int64_t(blockIdx.y) * a.blocks_per_split, end = split_end(a, blockIdx.y);",
        "int64_t(PLANTED ? 0 : blockIdx.y) * a.blocks_per_split, end = split_end(a, PLANTED ? 0 : blockIdx.y);"),
    "a block's moments counted twice": (
        "Groups::count(a, g) * Groups::mean(a, g, c);",
        "Groups::count(a, g) * Groups::mean(a, PLANTED && g + 1 < end ? g + 1 : g, c);"),
    "a row fetched ahead left unused": ("if (r + j * step < w.end) use(",
                                        "if (r + j * step < w.end && !(PLANTED && j == kRowsAhead - 1)) use("),
    "the ReLU's bits read unshifted": ("const unsigned run_bits = g.bits >> (i % 8);",
                                       "const unsigned run_bits = g.bits >> (PLANTED ? 0 : i % 8);"),
    "the fused pool's ties won by the last tap": ("if (z > best[e] || isnan(z))",
                                                  "if (z > best[e] || (PLANTED && z == best[e]) || isnan(z))"),
    "the pool's gradient missing each pixel's last window": (
        "last = last < outputs - 1 ? last : outputs - 1;",
        "last = (last < outputs - 1 ? last : outputs - 1) - PLANTED;"),
}
# In the gated MLP's passes (gated/gated.cu), built with the batch norm's
# planted units and failing the gated cases (run as many): the threads of
# the elements past the 16-byte runs each one element late, so that the
# first is never written.
GATED_MUTATIONS = {
    "a gated pass's first tail element unwritten": (
        "const int64_t i = vectors * kVector + (thread - vectors);",
        "const int64_t i = vectors * kVector + (thread - vectors) + PLANTED;"),
}
BATCH_NORM_MUTATIONS.update(GATED_MUTATIONS)
# In layer norm's passes (norm/layer_norm.cu), failing the layer-norm cases
# (run as many): a row's butterfly one step short (each lane's sum of half
# the lanes), the weights' sums without each slab's last warp, and the last
# of each group of rows fetched ahead fetched but never summed.
LAYER_NORM_MUTATIONS = {
    "a row's sum over half the lanes": (
        "for (int bit = kLayerNormLanes / 2; bit >= 1; bit /= 2) v +=",
        "for (int bit = kLayerNormLanes / 2; bit >= (PLANTED ? 2 : 1); bit /= 2) v +="),
    "a slab's last warp left out of the weights' sums": (
        "for (int w = 0; w < kLayerNormWarps; ++w)", "for (int w = 0; w + PLANTED < kLayerNormWarps; ++w)"),
    "a row fetched ahead left out of the weights' sums": (
        "if (r + j * step < end) {", "if (r + j * step < end && !(PLANTED && j == kRowsAhead - 1)) {"),
}
BATCH_NORM_MUTATIONS.update(LAYER_NORM_MUTATIONS)
# In the finish by lines (norm/batch_norm_line_finish.cuh), failing its
# fixed cases over hundreds of row blocks (each run: those and one case of
# batch norm's and the gated passes'): each lane's second row block left
# out, the butterfly's second step skipped (a warp's lanes 2 and 3 of each
# channel left out), and the last warp's totals left out.
LINE_FINISH_MUTATIONS = {
    "a lane's second row block left out of the finish": (
        "const bool held = in_channels && lane + i * kLineLanes < a.blocks;",
        "const bool held = in_channels && lane + i * kLineLanes < a.blocks && !(PLANTED && i == 1);"),
    "the finish's butterfly one step short": ("for (int bit = kLineChannels; bit < 32; bit *= 2) {",
                                              "for (int bit = kLineChannels; bit < (PLANTED ? 16 : 32); bit *= 2) {"),
    "the finish's last warp left out": ("for (int w = 0; w < kLineWarps; ++w) total +=",
                                        "for (int w = 0; w + PLANTED < kLineWarps; ++w) total +="),
}
BATCH_NORM_MUTATIONS.update(LINE_FINISH_MUTATIONS)
LINE_FINISH_CASES = 3
# Each batch-norm bug's run: as many batch-norm and gated cases (at seed 1
# each bug fails at least one of them, most several; a bug of the default
# finish meets it in half the batch-norm cases, the others taking the finish
# by lines; 24, as before, took twice the time).
BATCH_NORM_MUTANT_CASES = 12
BATCH_NORM_UNITS = ["norm/batch_norm.cu", "norm/column_moments.cu", "gated/gated.cu", "norm/layer_norm.cu"]
# The Hopper runs: (copies land late, wgmmas read late), and their seeds.
HOPPER_CASES = 24
# Random convolutions per Hopper run, case i of pass i % 3; one in five of
# each pass has channels the Hopper convolution does not take
# (hopper_conv_cases.cpp fails a case the path takes that does not run on
# it, or one it does not take that does); every other wgrad case splits its
# sum; two dgrad cases in three have a stride, some of them phases no tap
# reaches, and two in three of those stage their rows through shared memory.
HOPPER_CONV_CASES = 30
HOPPER_MIN_CONV_WGMMA_CASES = 15
HOPPER_RUNS = {(False, False): 11, (True, True): 12, (True, False): SEED, (False, True): SEED}
# About half of the cases take the Hopper path (the rest: split-K on WMMA
# tiles, operands the copy engine cannot describe), and exactly an eighth its
# pairs of blocks (wgmma_2x1), which only MPGEMM_GEMM_PATH asks for; an
# eighth asks for pairs with ping-pong consumers (wgmma_pingpong), which the
# heuristic also gives the small problems on 132 multiprocessors:
# hopper_cases fails a pair case that does not run the kernel it asks for;
# an eighth the narrow tiles (wgmma_n128, wgmma_n64), forced or picked by
# the default, each of which must run the kernel it names.
HOPPER_MIN_WGMMA_CASES = 3
HOPPER_PAIR_CASES = HOPPER_MIN_PING_PONG_CASES = HOPPER_CASES // 8
# Of those, some store D through the copy engine (the rest from registers).
HOPPER_MIN_COPIED_OUT_CASES = 2
# Planted bugs in the Hopper kernel's pieces (csrc/kernels/sm90) and its
# launcher (sm90/launch_kernel.cuh), each with the timing that exposes it
# soonest, what the simulation must say (texts separated by | where either
# will do; the wrong consumer parity: "...that a box copy has yet to write"
# or "...that no box copy has written", whichever the race gives), and the
# Hopper tile whose kernel carries it: the tile's bugs share a planted
# build, which compiles that one kernel from the planted copy
# (kernel_sim/hopper_planted.cpp, fp16 on K-major operands) ahead of the
# unplanted ones, and runs every case on its layouts and input type
# (`hopper_cases ... pinned`). A bug in code the
# kernels share (the epilogue) reaches the planted kernel alike.
HOPPER_MUTATED_FILES = ["sm90/block.cuh", "sm90/gemm_kernel.cuh", "sm90/producer.cuh", "sm90/mainloop.cuh", "sm90/epilogue.cuh",
                        "sm90/launch_kernel.cuh", "sm90/pipeline.cuh", "sm90/stream_k.cuh"]
HOPPER_MUTATIONS = {
    "consumer waits on the wrong parity": (
        ("mbarrier_wait(&shared.full[pipe.stage], pipe.phase)",
         "mbarrier_wait(&shared.full[pipe.stage], pipe.phase ^ PLANTED)"),
        (True, True), "a wgmma is issued on shared memory", "WgmmaTile"),
    "producer waits on the wrong parity": (
        ("mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1)",
         "mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1 ^ PLANTED)"),
        (False, False), "deadlock", "WgmmaTile"),
    "stage handed back before its wgmmas retire": (
        ("wgmma_wait<1>()", "(PLANTED ? wgmma_wait<2>() : wgmma_wait<1>())"), (False, True),
        "a box copy lands on shared memory", "WgmmaTile"),
    "accumulators reused without wgmma.fence": (
        ("    wgmma_fence();\n", "    if (!PLANTED) wgmma_fence();\n"), (False, False), "without wgmma.fence",
        "WgmmaTile"),
    # A pair's consumers hand each stage back to their own producer alone, so
    # the other block's producer multicasts over a stage they still read.
    "stage of a pair handed back to one producer": (
        ("mbarrier_arrive_cluster(&shared.empty[stage], thread)",
         "mbarrier_arrive_cluster(&shared.empty[stage], PLANTED ? cluster_rank() : thread)"),
        (False, True), "a box copy lands on shared memory", "WgmmaPairTile"),
    # A pair's producer leaves without waiting for the other block's last hand-backs.
    "block of a pair exits before the other's arrivals": (
        ("  if constexpr (Tile::kClusterM > 1) {\n    for (int s = 0;",
         "  if constexpr (Tile::kClusterM > 1) {\n    if (!PLANTED) for (int s = 0;"),
        (False, False), "after it exited", "WgmmaPairTile"),
    # The epilogue's output strips: a buffer written again while the store
    # before last may still read it (stores then read late, so the wrong
    # strip reaches D), or before the warpgroup has met after the wait; a
    # strip stored before all its threads have written it, or unfenced.
    "output strip rewritten before its store has read it": (
        ("bulk_wait_group_read<Config::kOutputBuffers - 1>()",
         "(PLANTED ? bulk_wait_group_read<Config::kOutputBuffers>() : bulk_wait_group_read<Config::kOutputBuffers - 1>())"),
        (True, False), "FAILED", "WgmmaTile"),
    # (Wrong values, or an unfenced read where the others have written but not fenced: whichever the race gives.)
    "output strip stored before the warpgroup has written it": (
        ("    fence_proxy_async_shared();\n    named_barrier_sync(barrier, Config::kWarpgroupThreads);\n",
         "    fence_proxy_async_shared();\n    if (!PLANTED) named_barrier_sync(barrier, Config::kWarpgroupThreads);\n"),
        (False, False), "FAILED|without fence.proxy.async", "WgmmaTile"),
    "output strip rewritten before the store before last has been waited for": (
        ("    if (thread == 0) bulk_wait_group_read<Config::kOutputBuffers - 1>();\n"
         "    named_barrier_sync(barrier, Config::kWarpgroupThreads);\n",
         "    if (thread == 0) bulk_wait_group_read<Config::kOutputBuffers - 1>();\n"
         "    if (!PLANTED) named_barrier_sync(barrier, Config::kWarpgroupThreads);\n"),
        (True, False), "FAILED", "WgmmaTile"),
    "output strip stored without fence.proxy.async": (
        ("    fence_proxy_async_shared();\n", "    if (!PLANTED) fence_proxy_async_shared();\n"),
        (False, False), "without fence.proxy.async", "WgmmaTile"),
    "stores still in flight at exit": (
        ("  if (thread == 0) bulk_wait_group<0>();\n", "  if (thread == 0 && !PLANTED) bulk_wait_group<0>();\n"),
        (True, False), "box stores never waited for", "WgmmaTile"),
    # Ping-pong: a consumer that does not skip the other's slices in the ring
    # after its tile; mainloops that do not wait for their turn (a consumer
    # then waits on a stage two rounds ahead, whose parity reads as done); a
    # turn handed on where no tile follows (an arrival outlives the block).
    "ping-pong consumer keeps its place in the ring": (
        ("    if constexpr (Tile::kPingPong) pipe.advance(k_slices);\n",
         "    if constexpr (Tile::kPingPong) {\n      if (!PLANTED) pipe.advance(k_slices);\n    }\n"),
        (True, True), "a wgmma is issued on shared memory|deadlock", "WgmmaPingPongTile"),
    "ping-pong mainloops that do not take turns": (
        ("if (t != first_tile) named_barrier_sync(kTurnBarrier + consumer, kTurnThreads);",
         "if (t != first_tile) {\n        if (PLANTED) named_barrier_arrive(kTurnBarrier + consumer, kTurnThreads);\n"
         "        else named_barrier_sync(kTurnBarrier + consumer, kTurnThreads);\n      }"),
        (False, False), "a box copy lands on shared memory|a wgmma is issued on shared memory", "WgmmaPingPongTile"),
    "ping-pong turn handed on after the block's last tile": (
        ("if (t + tile_step < tiles) named_barrier_arrive(", "if (PLANTED || t + tile_step < tiles) named_barrier_arrive("),
        (False, False), "which never opened", "WgmmaPingPongTile"),
    # The launcher of the pair kernels (sm90/launch_kernel.cuh) asking the
    # driver how many clusters fit on every launch, not once per device.
    "cluster occupancy asked on every launch": (
        ("  static PerDeviceFact resident_clusters;",
         "  static PerDeviceFact asked_once;\n  PerDeviceFact asked_on_this_launch;\n"
         "  PerDeviceFact& resident_clusters = PLANTED ? asked_on_this_launch : asked_once;"),
        (False, False), "asked 2 times", "WgmmaPairTile"),
    # Split-K on the Hopper block: every split sums the first split's K
    # slices (the split's place in K lost).
    "split-K's splits all summing the first range of K": (
        ("int(tile.batch) * slices, slices, rank, pipe)",
         "(PLANTED ? 0 : int(tile.batch) * slices), slices, rank, pipe)"),
        (False, False), "FAILED", "WgmmaTile"),
    # Stream-K: the block that ends a tile adding every earlier run's slot
    # but the nearest; each block leaving its sums in the next block's slot
    # (read back poisoned, or overwriting another's).
    "stream-K's tile summed without its nearest slot": (
        ("for (int peer = int(blockIdx.x) - 1; peer >= unit.first_peer; --peer)",
         "for (int peer = int(blockIdx.x) - 1 - (PLANTED ? 1 : 0); peer >= unit.first_peer; --peer)"),
        (False, False), "FAILED", "WgmmaTile"),
    "stream-K's sums left in another block's slot": (
        ("float4* mine = slot(blockIdx.x, consumer) + thread;",
         "float4* mine = slot(int(blockIdx.x) + (PLANTED ? 1 : 0), consumer) + thread;"),
        (False, False), "FAILED", "WgmmaTile"),
    # A narrow tile's slots spaced as the wide tile's (twice its 64 x 128
    # sums a consumer): the later blocks' slots past the workspace's. The
    # wide tile's planted build has the 128 x 128 tile's stream-K kernel.
    "stream-K's narrow slots spaced as the wide tile's": (
        ("(int64_t(block) * Config::kConsumers + consumer) * kVectors * Config::kWarpgroupThreads;",
         "(int64_t(block) * Config::kConsumers + consumer) * (PLANTED ? WgmmaTile::kAccumulators / 4 : kVectors) *\n"
         "               Config::kWarpgroupThreads;"),
        (False, False), "FAILED|AddressSanitizer", "WgmmaTile"),
    # The pre-activation kernel storing GELU's (or ReLU's) output where its
    # input belongs: the sums activated before the pre-activation's store.
    "pre-activation stored after the activation": (
        ("  if constexpr (WithPreActivation) store(z_map, p.pre_activation);\n"
         "  if constexpr (WithGeluTanh) activate_gelu_tanh(acc);\n"
         "  else if constexpr (!WithActivationGrad) activate(acc, p);\n",
         "  if (PLANTED) activate(acc, p);\n  if constexpr (WithPreActivation) store(z_map, p.pre_activation);\n"
         "  if constexpr (WithGeluTanh) activate_gelu_tanh(acc);\n"
         "  else if (!PLANTED && !WithActivationGrad) activate(acc, p);\n"),
        (False, False), "Z[", "WgmmaTile"),
    # The activation derivative's kernel adding the bias and applying the
    # activation as a forward's epilogue does, Z never read.
    "activation's derivative left out of the epilogue": (
        ("  if constexpr (WithActivationGrad) multiply_by_activation_grad<Element>(acc, p, s, batch, row0, col0, thread);\n"
         "  else add_bias(acc, p, col0, thread);\n",
         "  if (WithActivationGrad && !PLANTED) multiply_by_activation_grad<Element>(acc, p, s, batch, row0, col0, thread);\n"
         "  else add_bias(acc, p, col0, thread);\n"),
        (False, False), "FAILED", "WgmmaTile"),
    # Its words of Z loaded ahead for a whole tile's width (no checks), each
    # thread's two rows swapped: wrong only where a thread's rows and the
    # tile's columns all lie inside D, which the derivative's cases on a
    # tile of D's whole width reach.
    "a whole tile's words of Z taken from the other row": (
        ("words[g][h] = *reinterpret_cast<const uint32_t*>(z[h] + 8 * (g0 + g));",
         "words[g][h] = *reinterpret_cast<const uint32_t*>(z[h ^ PLANTED] + 8 * (g0 + g));"),
        (False, False), "FAILED", "WgmmaTile"),
    # The row sums kernel's tile of ones written without fence.proxy.async:
    # its wgmmas (the async proxy) may read what the threads wrote before it.
    "tile of ones read by wgmma without fence.proxy.async": (
        ("  fence_proxy_async_shared();\n}", "  if (!PLANTED) fence_proxy_async_shared();\n}"),
        (False, False), "a thread wrote without fence.proxy.async", "WgmmaTile"),
    # The block's threads going on before thread 0 has initialized the
    # mbarriers: caught where the launch's order of turns (mock/fibers.h)
    # lets another thread run first.
    "mbarriers used before the block has met after their init": (
        ("  if constexpr (Tile::kClusterM == 1) __syncthreads();",
         "  if constexpr (Tile::kClusterM == 1) {\n    if (!PLANTED) __syncthreads();\n  }"),
        (False, False), "used before mbarrier.init", "WgmmaTile"),
    # A narrow tile's ring walked as if it had the deepest ring's stages (8
    # for the 128 x 128 tile's 6): stages past its shared memory.
    "ring deeper than the narrow tile's stages": (
        ("using TilePipeline = PipelineState<Tile::kStages>;",
         "using TilePipeline = PipelineState<WgmmaBlockConfig::kMaxStages>;"),
        (False, False), "used before mbarrier.init|a box copy lands|a wgmma is issued|FAILED|deadlock", "WgmmaN128Tile"),
}
# The GEMM cases a planted bug's run takes where fewer than every one show
# it: the cluster occupancy's check follows the cases and asks on devices of
# its own, so one case will do.
HOPPER_MUTANT_CASES = {"cluster occupancy asked on every launch": 1,
                       # The stream-K cases run after the GEMM cases.
                       "stream-K's tile summed without its nearest slot": 1,
                       "stream-K's sums left in another block's slot": 1,
                       "stream-K's narrow slots spaced as the wide tile's": 1}
# Planted bugs in the Hopper convolution: the file and text, the timing,
# what the simulation must say, and the pass whose kernel carries it
# (STAGED_ROWS: dgrad's that stages a strided phase's rows; DGRAD_PHASES:
# dgrad's that runs a strided dgrad's phases in one launch; kFprop: fprop's,
# and the one that also writes column moments). The bugs of a
# kernel (its producer, mainloop or epilogue) are built as the GEMM's are,
# one build for a pass's: the one fp16 kernel of that pass from the planted
# copy (kernel_sim/hopper_conv_planted.cpp), linked ahead of the real ones,
# and every case runs on fp16 (`pinned`). Bugs in host code (pass None) build
# the convolution's unit (sm90/conv_launch.cu) from the planted copy in place
# of the real one. Either runs convolutions alone.
# The convolution cases a planted bug's run takes where fewer than every one
# show it: the addend's bugs, from case 1 (a dgrad at stride 1 asking for
# the addend; hopper_conv_cases.cpp), so that the two runs cost little.
CONV_MUTANT_CASES = {"dgrad's addend left out of the epilogue": 2, "the addend's words read unchecked at D's edges": 2}
STAGED_ROWS = "staged rows"
DGRAD_PHASES = "dgrad phases"
GATHERED_FOLD = "gathered fold"
CONV_MUTATIONS = {
    # The im2col box read at tap (s, r) instead of (r, s).
    "im2col box at the wrong filter offset": (
        "sm90/conv_producer.cuh",
        ("uint16_t(s * walk.dilation_w), uint16_t(r * walk.dilation_h)",
         "uint16_t((PLANTED ? r : s) * walk.dilation_w), uint16_t((PLANTED ? s : r) * walk.dilation_h)"),
        (False, False), "FAILED", "kFprop"),
    # A bounding box one pixel short at the far corner: the walk wraps to the next row a window early.
    "bounding box with the wrong far corner": (
        "sm90/conv_launch.cu",
        ("(out - 1) * stride - pad - (extent - 1)}", "(out - 1) * stride - pad - (PLANTED ? extent : extent - 1)}"),
        (False, False), "FAILED", None),
    "stage handed back before its wgmmas retire": (
        "sm90/mainloop.cuh", ("wgmma_wait<1>()", "(PLANTED ? wgmma_wait<2>() : wgmma_wait<1>())"), (False, True),
        "a box copy lands on shared memory", "kFprop"),
    "dgrad's filters read unflipped": (
        "sm90/conv_producer.cuh",
        ("walk.filter_tap_last - r * walk.filter_row_step - s * walk.filter_col_step",
         "(PLANTED ? r * walk.s + s : walk.filter_tap_last - r * walk.filter_row_step - s * walk.filter_col_step)"),
        (False, False), "FAILED", "kDgrad"),
    # A strided dgrad's phases stored as if their pixels were dense rows of dx.
    "dgrad's phases stored to dense rows": (
        "sm90/conv_launch.cu",
        ("if (g.rows != c.h || g.cols != c.w)", "if (!PLANTED && (g.rows != c.h || g.cols != c.w))"), (False, False),
        "FAILED", None),
    # dgrad's epilogue built to add its addend (MPGEMM_DGRAD_ADDEND=1) leaving it out.
    "dgrad's addend left out of the epilogue": (
        "sm90/epilogue.cuh",
        ("  if constexpr (WithAddend) add_addend<Element>(acc, p, s, batch, row0, col0, thread);",
         "  if (WithAddend && !PLANTED) add_addend<Element>(acc, p, s, batch, row0, col0, thread);"),
        (False, False), "FAILED", "kDgrad"),
    # The addend read in whole words at D's edges too (the epilogue's loads
    # of an operand, sm90/epilogue.cuh's for_each_operand_run): past D's last
    # row, past the end of the addend.
    "the addend's words read unchecked at D's edges": (
        "sm90/epilogue.cuh",
        ("const bool inside = s.d_pairs && rows[1] < p.m && col0 + 2 * Registers <= p.n;",
         "const bool inside = PLANTED || (s.d_pairs && rows[1] < p.m && col0 + 2 * Registers <= p.n);"),
        (False, False), "AddressSanitizer|FAILED", "kDgrad"),
    # A phase's pixel rows a row of the phase apart instead of stride_h rows of dx.
    "dgrad's phase rows without the stride between them": (
        "sm90/epilogue.cuh", ("a * g.row_pitch", "a * (PLANTED ? g.cols * g.col_pitch : g.row_pitch)"), (False, False),
        "FAILED|AddressSanitizer", "kDgrad"),
    "wgrad's boxes at the transposed tap": (
        "sm90/conv_producer.cuh",
        ("w_offset[box] = s * walk.dilation_w, h_offset[box] = r * walk.dilation_h;",
         "w_offset[box] = (PLANTED ? r : s) * walk.dilation_w, h_offset[box] = (PLANTED ? s : r) * walk.dilation_h;"),
        (False, False), "FAILED", "kWgrad"),
    # MPGEMM_M64_TILE's tile taken where the switch is off: wgrad's cases of more than 128 columns must then run
    # on the tile the narrow tiles' rule names.
    "the 64-row tile taken without being asked for": (
        "sm90/conv_launch.cu",
        ("if (m64_tile && m <= m64.block_m", "if ((PLANTED || m64_tile) && m <= m64.block_m"),
        (False, False), "FAILED", None),
    "wgrad's splits all summing the first pixels": (
        "sm90/conv_producer.cuh",
        ("const int first_pixel = int(tile.batch) * walk.k_slices * Config::kBlockK;",
         "const int first_pixel = PLANTED ? 0 : int(tile.batch) * walk.k_slices * Config::kBlockK;"),
        (False, False), "FAILED", "kWgrad"),
    # fprop's epilogue moments of a whole strip (MPGEMM_EPILOGUE_STATS: the
    # strip's loads issued together from two offsets, a lane's rows 4 apart
    # alternating between two swizzles) with every load at the first offset:
    # rows group + 8k summed twice, rows group + 4 + 8k never.
    "a whole strip's moments summing half its rows twice": (
        "sm90/epilogue.cuh", ("ld_shared_4(at[i % 2] +", "ld_shared_4(at[PLANTED ? 0 : i % 2] +"), (False, False),
        "FAILED", "kFprop"),
    # A strided dgrad's staged strip read back before the warpgroup has met
    # after writing it (MPGEMM_STAGED_ROW_STORES=1): the simulation orders
    # ordinary shared-memory accesses between threads by named barriers.
    "staged strip read back before the warpgroup has written it": (
        "sm90/epilogue.cuh",
        ("    write_strip<Out>(acc, buffer, strip, rows, thread);\n"
         "    named_barrier_sync(barrier, Config::kWarpgroupThreads);\n",
         "    write_strip<Out>(acc, buffer, strip, rows, thread);\n"
         "    if (!PLANTED) named_barrier_sync(barrier, Config::kWarpgroupThreads);\n"),
        (False, False), "with no barrier between", STAGED_ROWS),
    # One launch's tiles (the default's, MPGEMM_DGRAD_ONE_LAUNCH unset) each found in the phase
    # before theirs at its first tile: tiles of one phase's pixels walked
    # and stored as another's.
    # One launch's tiles each walking the first phase's taps (the most): a
    # phase's tiles read the wrong taps, and those of a phase no tap reaches
    # copy through the map it has none of (or slices no consumer waits for).
    "one launch's tiles walking the first phase's taps": (
        "sm90/conv_kernel.cuh", ("phases.walk[tile.batch], pipe);", "phases.walk[PLANTED ? 0 : tile.batch], pipe);"),
        (False, False), "a tensor map no encoder wrote|FAILED|deadlock|a box copy lands", DGRAD_PHASES),
    "one launch's first tile of a phase given to the phase before": (
        "sm90/tile_scheduler.cuh",
        ("t >= phases.first_tile[i]", "(PLANTED ? t > phases.first_tile[i] : t >= phases.first_tile[i])"),
        (False, False), "FAILED|AddressSanitizer", DGRAD_PHASES),
    # One launch's phases without those no tap reaches: their pixels of dx
    # never written (the launch a phase zeroes dx first; one launch must
    # store its zeros).
    "one launch's phases no tap reaches left out": (
        "sm90/conv_launch.cu",
        ("    phases.launch[phases.count++] = dgrad_launch(c, phase_h, phase_w, g);",
         "    if (!PLANTED || g.k > 0) phases.launch[phases.count++] = dgrad_launch(c, phase_h, phase_w, g);"),
        (False, False), "FAILED", None),
    # The producer's gathered folds (MPGEMM_GATHERED_FOLD=1): its threads'
    # stores left unfenced for the wgmmas that read them (the async proxy),
    # and every folded channel read from the first of its stride_h runs.
    "the gathered fold's stores left unfenced": (
        "sm90/conv_gather_producer.cuh",
        ("  gather();\n  fence_proxy_async_shared();\n", "  gather();\n  if (!PLANTED) fence_proxy_async_shared();\n"),
        (False, False), "without fence.proxy.async", GATHERED_FOLD),
    "the gathered fold's channels all read from its first run": (
        "sm90/conv_gather_producer.cuh",
        ("r2 = tap / f.s,", "r2 = PLANTED ? 0 : tap / f.s,"),
        (False, False), "FAILED", GATHERED_FOLD),
    # A narrow tile's filters copied in the wide tile's boxes: more bytes
    # than its stage announces, past its B tile.
    "filter boxes sized for the wide tile": (
        "sm90/conv_launch.cu",
        ("using BTile = typename sm90::ConvSmem<Tile, Pass>::BTile;",
         "using BTile = typename sm90::ConvSmem<WgmmaTile, Pass>::BTile;"),
        (False, False), "deadlock|a box copy lands|FAILED", None),
}
CONV_UNIT = "sm90/conv_launch.cu"
# Planted bugs in the GEMM's launcher (gemm/launch.cu, a unit the Hopper
# driver links at sim arch 800), built as a copy of that unit in place of the
# real one: a padded plan's copies each one element short of its runs, the
# last element left as the workspace's poison; the product run again for the
# pre-activation with the activation kept (the split case that asks for it);
# the split row sums reduced from the first split alone (the split row sums
# case); every plan's row sums on the wide tile's kernel (caught by the row
# sums cases on the other tiles, which follow the random cases: its run
# takes one random case, not every one).
GEMM_LAUNCH_UNIT = "gemm/launch.cu"
GEMM_LAUNCH_MUTATIONS = {
    "padded copies a run short": (("size_t(inner) * 2, size_t(runs)", "size_t(inner - PLANTED) * 2, size_t(runs)"),
                                  "padded case"),
    "pre-activation run again with the activation": (
        ("again.activation = Activation::kNone;", "again.activation = PLANTED ? run.activation : Activation::kNone;"),
        "Z["),
    "activation derivative's pass left out after the product": (
        ("    return launch_activation_grad_pass(run, stream);",
         "    if (PLANTED) return cudaSuccess;\n    return launch_activation_grad_pass(run, stream);"),
        "activation_grad=1"),
    "split row sums reduced from the first split alone": (
        ("row_sum_partials, p.m, plan.split_k, stream)", "row_sum_partials, p.m, PLANTED ? 1 : plan.split_k, stream)"),
        "row sum"),
    # Every plan's row sums on the wide tile's kernel: the same sums, from a
    # launch that is not the plan's.
    "row sums on the wide tile whatever the plan": (
        ("return launch_wgmma_row_sums_gemm<Tile>(",
         "return (PLANTED ? launch_wgmma_row_sums_gemm<WgmmaTile> : launch_wgmma_row_sums_gemm<Tile>)("),
        "the last launch was not the plan's row sums kernel"),
}
LAUNCH_MUTANT_CASES = {"row sums on the wide tile whatever the plan": 1}
# Planted bugs in x's fold (conv/folded_taps.cu, a unit of its own at sim arch
# 800), its planted copy linked in place of the real one into the launcher's
# planted binary, numbered after the launcher's bugs; their runs check the
# folds alone (no GEMM or convolution cases), and must say what the
# simulation says (texts separated by | where either will do): a chunk's run
# read one element past x's last column (the pixels whose windows cross x's
# right edge: the next pixel's channel, or past the end of x).
FOLD_UNIT = "conv/folded_taps.cu"
FOLD_MUTATIONS = {
    "a chunk's run read past x's last column": (
        ("unsigned(u - lo) < unsigned(span)", "unsigned(u - lo) < unsigned(span + PLANTED)"),
        "x's fold in chunks|AddressSanitizer: heap-buffer-overflow"),
}
# LeakSanitizer cannot run under ptrace, as in some CI containers; leaks of the
# driver say nothing about the kernels anyway.
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


def source_flags(arch, kernel_dir, defines=()):
    """g++'s defines and include paths for a unit at sim arch `arch`."""
    # Sim arch 900 is sm_90a, whose code alone has the Hopper GEMM.
    hopper = ["-D__CUDA_ARCH_FEAT_SM90_ALL"] if arch >= 900 else []
    # The stand-ins must shadow the real CUDA headers, and the simulation's
    # instruction layer (kernel_sim/arch) the kernels' own.
    return [f"-D__CUDA_ARCH__={arch}", *hopper, *defines, "-I", MOCK_DIR, "-I", SIM_DIR, "-I",
            kernel_dir, "-I", os.path.dirname(SIM_DIR)]


def precompile_cuda_headers(out, arch, flags):
    """kernel_sim/mock/cuda_headers.h precompiled in `out` for units at sim
    arch `arch` built with `flags` (the stand-ins read __CUDA_ARCH__): the
    header that compile_object's -include then reads precompiled. Built with
    the stand-ins alone on the include path, so that one that included a
    kernel header (whose planted copies the units compile) would fail here."""
    os.makedirs(out)
    header = os.path.join(out, "cuda_headers.h")
    shutil.copyfile(CUDA_HEADERS, header)
    defines = [flag for flag in source_flags(arch, KERNEL_DIR) if flag.startswith("-D")]
    cmd = ["g++", *flags, *defines, "-I", MOCK_DIR, "-x", "c++-header", header, "-o", header + ".gch"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"g++ failed on {header} for arch {arch}:\n{proc.stderr[-8000:]}"
    return header


def compile_object(source, arch, kernel_dir, out, defines=(), flags=CXXFLAGS, precompiled_headers=None):
    """Compiles `source` at sim arch `arch`, after `precompiled_headers`
    (precompile_cuda_headers's, for the same arch and flags) if given."""
    include = ["-Winvalid-pch", "-include", precompiled_headers] if precompiled_headers else []
    cmd = ["g++", *flags, *source_flags(arch, kernel_dir, defines), *include, "-x", "c++", "-c", source, "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"g++ failed on {source} for arch {arch}:\n{proc.stderr[-8000:]}"
    assert "invalid-pch" not in proc.stderr, f"g++ did not take {precompiled_headers}:\n{proc.stderr}"
    return out


def same_code_at_800_and_900(source):
    """Whether `source` preprocesses to the same text at sim arch 800 and 900
    but for at-least checks of the arch (`__CUDA_ARCH__ >= X`) that both
    pass alike: against a number of at most 800, or against a tile's or an
    input type's minimum arch, which for every WMMA tile and input type is
    at most sm_80 (hopper_cases.cpp asserts it)."""
    def alike(check):
        threshold = check.group(1)
        return check.group(0) if threshold and int(threshold) > 800 else "ARCH >= " + (threshold or "")

    texts = []
    for arch in (800, 900):
        cmd = ["g++", *CXXFLAGS, *source_flags(arch, KERNEL_DIR), "-include", CUDA_HEADERS, "-E", "-P", "-x", "c++",
               source]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"g++ -E failed on {source} for arch {arch}:\n{proc.stderr[-8000:]}"
        texts.append(re.sub(rf"\b{arch} >= (\d+\b)?", alike, proc.stdout))
    return texts[0] == texts[1]


def combined_unit(path, files):
    """A translation unit at `path` that includes each of `files`."""
    with open(path, "w") as f:
        f.write("".join(f'#include "{name}"\n' for name in files))
    return str(path)


def link(objects, out):
    proc = subprocess.run(["g++", *CXXFLAGS, *objects, "-o", out], capture_output=True, text=True)
    assert proc.returncode == 0, f"link failed:\n{proc.stderr[-8000:]}"
    return out


def printed_count(output, label):
    """The count a simulation printed after `label: `."""
    return int(re.search(re.escape(label) + r": (\d+)", output).group(1))


def run(args, timeout=300, env=None):
    """(exit code, output) of a driver; 124 and what it printed if it hangs."""
    try:
        proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **SANITIZER_ENV, **(env or {})})
    except subprocess.TimeoutExpired as hung:
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                         for part in (hung.stdout, hung.stderr))
        return 124, f"{output}\n{' '.join(map(str, args))}: no end after {timeout} s"
    return proc.returncode, proc.stdout + proc.stderr


def planted_env(number):
    """The environment of a run that plants bug `number` (None: none); a Hopper driver's run then stops at its
    first failed case."""
    return None if number is None else {"SIM_PLANTED_BUG": str(number), "SIM_FIRST_FAILURE": "1"}


def run_driver(binary, gemm_cases, unscale_cases, conv_cases, seed, late, batch_norm_cases=BATCH_NORM_CASES,
               planted=None, first_conv_case=0):
    return run([binary, gemm_cases, unscale_cases, conv_cases, seed, int(late), batch_norm_cases, first_conv_case],
               env=planted_env(planted))


def run_hopper(binary, seed, copies_late, wgmma_late, cases=HOPPER_CASES, conv_cases=HOPPER_CONV_CASES,
               pinned=False, planted=None):
    """A Hopper driver's run; one that plants bug number `planted` stops at its first failed case."""
    return run([binary, cases, conv_cases, seed, int(copies_late), int(wgmma_late)] + (["pinned"] if pinned else []),
               env=planted_env(planted))


def kernel_files(kernel_dir, pattern):
    """The paths under kernel_dir matching `pattern`, relative to it, sorted."""
    return sorted(os.path.relpath(p, kernel_dir) for p in glob.glob(os.path.join(kernel_dir, pattern), recursive=True))


def mutated_kernels(dest, mutations):
    """A copy of csrc/kernels in `dest` with each of `mutations`, (files,
    (text, replacement)), made: every occurrence of the text in those files
    replaced. Longer texts first, so that a text that holds another is
    replaced before it (its replacement keeping the other)."""
    shutil.copytree(KERNEL_DIR, dest)
    for files, (old, new) in sorted(mutations, key=lambda mutation: -len(mutation[1][0])):
        found = False
        for name in files:
            path = os.path.join(dest, name)
            with open(path) as f:
                text = f.read()
            if old in text:
                found = True
                with open(path, "w") as f:
                    f.write(text.replace(old, new))
        assert found, f"{old!r} is gone from csrc/kernels: update the mutation"
    return dest


def planted_builds(bugs):
    """The builds that plant `bugs`, {name: (mutation, the kernel it is
    planted in)}: [(kernel, [(number, name)])], each bug numbered by its
    place in `bugs`. The bugs of one kernel share a build, but a bug that a
    run cannot choose (no PLANTED in its replacement) has one of its own."""
    builds, shared = [], {}
    for number, (name, (mutation, kernel)) in enumerate(bugs.items()):
        if "PLANTED" not in mutation[1]:
            builds.append((kernel, [(number, name)]))
        elif kernel in shared:
            shared[kernel].append((number, name))
        else:
            shared[kernel] = [(number, name)]
            builds.append((kernel, shared[kernel]))
    return builds


def planted(mutation, number):
    """`mutation` as bug `number` plants it: PLANTED true where the run's SIM_PLANTED_BUG is `number`."""
    old, new = mutation
    return old, new.replace("PLANTED", f"::sim::planted({number})")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Builds the driver per arch (and one mutant) and the Hopper driver (and
    its mutants), runs every case set in parallel: {(arch, late, seed),
    ("mutant", name), ("hopper", copies_late, wgmma_late) or ("hopper mutant", name):
    (exit code, output)}."""
    if shutil.which("g++") is None:
        skip_or_fail("g++ not found")
    out = tmp_path_factory.mktemp("kernel_sim")
    kernels = kernel_files(KERNEL_DIR, "**/*.cu") + kernel_files(KERNEL_DIR, "plan/*.cpp")
    # The Hopper driver runs GEMMs and convolutions: their launchers and
    # every kernel they may pick. It compiles at sim arch 900 the files whose
    # code differs there (sm90/, whose kernels sim arch 800 compiles to their
    # headers alone) and links sim arch 800's objects of the units made of
    # these files alone (the WMMA tiles, the WMMA convolutions, the plans),
    # whose code is the same.
    shared_files = [name for name in kernels
                    if name.startswith(("conv/", "gemm/", "plan/", "wmma/gemm_", "norm/column_moments"))]
    hopper_kernels = [name for name in kernels if name.startswith("sm90/")]
    # The translation units, {name: files}, each compiled as one: a unit
    # costs about a second more than its code (the precompiled stand-ins
    # loaded, the models' inline code emitted again), and the Hopper
    # kernels' units share most of theirs (bench/NOTES.md, "The simulation's
    # units"). A unit that a planted build replaces compiles alone, as do
    # the two longest, which the pool then runs beside the others. Kernels
    # whose planted copies a planted build links first are in a unit apart
    # from their launcher, which could otherwise inline an unplanted copy.
    alone = ["wmma/gemm_tiles.cu", "conv/launch.cu", GEMM_LAUNCH_UNIT, FOLD_UNIT, *BATCH_NORM_UNITS]
    wmma_units = {
        "drivers": [os.path.join(SIM_DIR, name) for name in ("driver.cpp", "conv_cases.cpp", "conv_gemm_cases.cpp",
                                                             "gemm_cases.cpp", "batch_norm_cases.cpp",
                                                             "gated_cases.cpp", "layer_norm_cases.cpp")],
        **{name: [os.path.join(KERNEL_DIR, name)] for name in alone},
        "shared": [os.path.join(KERNEL_DIR, name) for name in shared_files if name not in alone],
        # The loss scale's kernels, the mma.sync ceiling and the Hopper
        # units, whose kernels compile to their headers alone at these archs.
        "others": [os.path.join(KERNEL_DIR, name) for name in kernels if name not in shared_files + alone],
    }
    hopper_units = {
        "drivers": [os.path.join(SIM_DIR, name) for name in ("hopper_cases.cpp", "hopper_conv_cases.cpp",
                                                             "conv_gemm_cases.cpp", "gemm_cases.cpp")],
        CONV_UNIT: [os.path.join(KERNEL_DIR, CONV_UNIT)],
        "conv_kernels": [os.path.join(KERNEL_DIR, name) for name in hopper_kernels
                         if name.startswith("sm90/conv_kernels_")],
        "gemm_kernels": [os.path.join(KERNEL_DIR, name) for name in hopper_kernels
                         if name.startswith("sm90/gemm_kernels_")],
        # The GEMM's launcher and the tensor maps.
        "others": [os.path.join(KERNEL_DIR, name) for name in hopper_kernels
                   if name != CONV_UNIT and not name.startswith(("sm90/conv_kernels_", "sm90/gemm_kernels_"))],
    }
    # The mutant: one WMMA tile's GEMM and convolution kernels with the
    # planted pipeline (kernel_sim/wmma_planted.cpp), linked ahead of the
    # real units.
    wmma_bugs = list(enumerate(WMMA_MUTATIONS))
    sliding_bugs = list(enumerate(SLIDING_MUTATIONS, start=len(wmma_bugs)))
    n16_bugs = list(enumerate(N16_MUTATIONS, start=len(wmma_bugs) + len(sliding_bugs)))
    gather_bugs = list(enumerate(GATHER_MUTATIONS, start=len(wmma_bugs) + len(sliding_bugs) + len(n16_bugs)))
    mutant_dir = mutated_kernels(str(out / "mutant"), [
        (["wmma/block.cuh"], planted(WMMA_MUTATIONS[name], number)) for number, name in wmma_bugs] + [
        (["conv/depthwise_sliding_wgrad.cuh"], planted(SLIDING_MUTATIONS[name], number))
        for number, name in sliding_bugs] + [
        (["conv/iterators.cuh"], planted(N16_MUTATIONS[name], number)) for number, name in n16_bugs] + [
        (["conv/depthwise_sliding_gather.cuh"], planted(GATHER_MUTATIONS[name][:2], number))
        for number, name in gather_bugs])
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        # The stand-in CUDA headers precompiled for each arch and set of
        # flags, submitted before the first compile that reads them (which
        # then waits on a job already started: the pool takes jobs in order).
        precompiled_headers = {}

        def compile_all(srcs, arch, kernel_dir, prefix, defines=(), flags=CXXFLAGS):
            key = (arch, tuple(flags))
            if key not in precompiled_headers:
                precompiled_headers[key] = pool.submit(precompile_cuda_headers,
                                                       str(out / f"cuda_headers{len(precompiled_headers)}"), arch,
                                                       flags)
            headers = precompiled_headers[key]
            return [pool.submit(lambda *args: compile_object(*args, headers.result()), src, arch, kernel_dir,
                                str(out / f"{prefix}{i}.{arch}.o"), defines, flags) for i, src in enumerate(srcs)]

        def compile_units(units, arch, prefix):
            """{name: its object's future} for `units`, {name: files}, at sim arch `arch`."""
            sources = [files[0] if len(files) == 1 else combined_unit(out / f"{prefix}{name}.{arch}.cpp", files)
                       for name, files in units.items()]
            return dict(zip(units, compile_all(sources, arch, KERNEL_DIR, prefix)))

        objects = {arch: compile_units(wmma_units, arch, "") for arch in sorted({arch for arch, _ in RUNS})}
        hopper_objects = compile_units(hopper_units, 900, "hopper.")
        same_code = {name: pool.submit(same_code_at_800_and_900, os.path.join(KERNEL_DIR, name))
                     for name in shared_files}
        mutant_object = compile_all([os.path.join(SIM_DIR, "wmma_planted.cpp")], 800, mutant_dir, "mutant.",
                                    flags=PLANTED_CXXFLAGS)[0]
        # Each planted build: [(bug number, name)] and its object.
        hopper_planted = []
        for i, (tile, bugs) in enumerate(planted_builds(
                {name: (mutation, tile) for name, (mutation, _, _, tile) in HOPPER_MUTATIONS.items()})):
            planted_dir = mutated_kernels(str(out / f"hopper_planted{i}"), [
                (HOPPER_MUTATED_FILES, planted(HOPPER_MUTATIONS[name][0], number)) for number, name in bugs])
            # WgmmaTile's split-K kernel too, the one tile that has one.
            defines = [f"-DPLANTED_TILE={tile}"] + (["-DPLANTED_SPLIT_K"] if tile == "WgmmaTile" else [])
            hopper_planted.append((bugs, compile_all([os.path.join(SIM_DIR, "hopper_planted.cpp")], 900, planted_dir,
                                                     f"hopper_planted{i}.", defines, PLANTED_CXXFLAGS)[0]))
        conv_planted = []
        for i, (planted_pass, bugs) in enumerate(planted_builds(
                {name: (mutation, planted_pass) for name, (_, mutation, _, _, planted_pass) in CONV_MUTATIONS.items()})):
            planted_dir = mutated_kernels(str(out / f"conv_planted{i}"), [
                ([CONV_MUTATIONS[name][0]], planted(CONV_MUTATIONS[name][1], number)) for number, name in bugs])
            unit = (os.path.join(SIM_DIR, "hopper_conv_planted.cpp") if planted_pass
                    else os.path.join(planted_dir, CONV_UNIT))
            defines = (["-DPLANTED_STAGED_ROWS"] if planted_pass == STAGED_ROWS
                       else ["-DPLANTED_DGRAD_PHASES"] if planted_pass == DGRAD_PHASES
                       else ["-DPLANTED_GATHERED_FOLD"] if planted_pass == GATHERED_FOLD
                       else [f"-DPLANTED_PASS={planted_pass}"] if planted_pass else [])
            # fprop's build plants its column moments' kernel too, dgrad's its addend's.
            defines += {"kFprop": ["-DPLANTED_FPROP_MOMENTS"],
                        "kDgrad": ["-DPLANTED_DGRAD_ADDEND"]}.get(planted_pass, [])
            conv_planted.append((bugs, compile_all([unit], 900, planted_dir, f"conv_planted{i}.", defines,
                                                   PLANTED_CXXFLAGS)[0]))
        launch_bugs = list(enumerate(GEMM_LAUNCH_MUTATIONS))
        fold_bugs = list(enumerate(FOLD_MUTATIONS, start=len(launch_bugs)))
        planted_dir = mutated_kernels(str(out / "launch_planted"), [
            ([GEMM_LAUNCH_UNIT], planted(GEMM_LAUNCH_MUTATIONS[name][0], number)) for number, name in launch_bugs] + [
            ([FOLD_UNIT], planted(FOLD_MUTATIONS[name][0], number)) for number, name in fold_bugs])
        # Both planted units as one translation unit (a unit costs about a second more than its code).
        launch_planted = compile_all([combined_unit(out / "launch_planted.cpp", [
            os.path.join(planted_dir, unit) for unit in (GEMM_LAUNCH_UNIT, FOLD_UNIT)])], 800, planted_dir,
            "launch_planted.", flags=PLANTED_CXXFLAGS)[0]
        batch_norm_bugs = list(enumerate(BATCH_NORM_MUTATIONS))
        planted_dir = mutated_kernels(str(out / "batch_norm_planted"), [
            (BATCH_NORM_FILES, planted(BATCH_NORM_MUTATIONS[name], number)) for number, name in batch_norm_bugs])
        batch_norm_planted = compile_all([os.path.join(planted_dir, unit) for unit in BATCH_NORM_UNITS], 800,
                                         planted_dir, "batch_norm_planted.", flags=PLANTED_CXXFLAGS)
        binaries = {arch: link([o.result() for o in objs.values()], str(out / f"sim_{arch}"))
                    for arch, objs in objects.items()}
        # The planted kernels first: the linker keeps the first definition it meets.
        mutant = link([mutant_object.result()] + [o.result() for o in objects[800].values()], str(out / "sim_mutant"))
        without_batch_norm = [o.result() for name, o in objects[800].items() if name not in BATCH_NORM_UNITS]
        batch_norm_binary = link([o.result() for o in batch_norm_planted] + without_batch_norm,
                                 str(out / "sim_batch_norm_planted"))
        for name, same in same_code.items():
            assert same.result(), f"{name} compiles differently at sim arch 900: build it there for the Hopper driver"
        hopper = [o.result() for o in hopper_objects.values()] + [
            o.result() for name, o in objects[800].items()
            if all(os.path.relpath(f, KERNEL_DIR) in shared_files for f in wmma_units[name])]
        hopper_binary = link(hopper, str(out / "sim_hopper"))
        # Each bug's (binary, number).
        hopper_planted_binaries = {}
        for i, (bugs, o) in enumerate(hopper_planted):
            binary = link([o.result()] + hopper, str(out / f"sim_hopper_planted{i}"))
            hopper_planted_binaries.update({name: (binary, number) for number, name in bugs})
        # The launcher's and the fold's planted units in place of the real ones.
        real_units = {objects[800][GEMM_LAUNCH_UNIT].result(), objects[800][FOLD_UNIT].result()}
        launch_binary = link([launch_planted.result()] + [o for o in hopper if o not in real_units],
                             str(out / "sim_launch_planted"))
        # A planted kernel comes first (its copies of shared code are the ones
        # kept); a planted unit replaces the real one.
        conv_unit = hopper_objects[CONV_UNIT].result()
        without_conv = [o for o in hopper if o != conv_unit]
        conv_planted_binaries = {}
        for i, (bugs, o) in enumerate(conv_planted):
            planted_pass = CONV_MUTATIONS[bugs[0][1]][4]
            binary = link([o.result()] + (hopper if planted_pass else without_conv), str(out / f"sim_conv_planted{i}"))
            conv_planted_binaries.update({name: (binary, number) for number, name in bugs})

        # The longest runs first (the Hopper ones, about 20 s each here), so that no long one is left to run alone.
        jobs = {}
        for (copies_late, wgmma_late), seed in HOPPER_RUNS.items():
            jobs[("hopper", copies_late, wgmma_late)] = pool.submit(run_hopper, hopper_binary, seed, copies_late,
                                                                    wgmma_late)
        for arch, late in RUNS:
            for seed in (FIXED_SEEDS[(arch, late)], SEED):
                jobs[(arch, late, seed)] = pool.submit(run_driver, binaries[arch], GEMM_CASES, UNSCALE_CASES,
                                                       CONV_CASES, seed, late)
        jobs[("mutant", "an early read of a pipeline stage")] = pool.submit(run_driver, mutant, 20, 0, 9, 1, True, 0,
                                                                            planted=0)
        jobs[("mutant", "a warp row's column moments dropped")] = pool.submit(run_driver, mutant, 0, 0, 49, 1, False,
                                                                              0, planted=1, first_conv_case=48)
        # The sliding windows' and the 128 x 16 tile's cases alone (conv cases from 1 to 1: none of conv_case's).
        for number, name in sliding_bugs + n16_bugs + gather_bugs:
            jobs[("mutant", name)] = pool.submit(run_driver, mutant, 0, 0, 1, 1, False, 0, planted=number,
                                                 first_conv_case=1)
        jobs[("mutant", "an early read of a pipeline stage", "n16")] = pool.submit(
            run_driver, mutant, 0, 0, 1, 1, True, 0, planted=0, first_conv_case=1)
        for number, name in batch_norm_bugs:
            cases = 1 if name in LINE_FINISH_MUTATIONS else BATCH_NORM_MUTANT_CASES
            jobs[("batch norm mutant", name)] = pool.submit(run_driver, batch_norm_binary, 0, 0, 0, 1, False, cases,
                                                            planted=number)
        for name, (_, (copies_late, wgmma_late), _, _) in HOPPER_MUTATIONS.items():
            binary, number = hopper_planted_binaries[name]
            jobs[("hopper mutant", name)] = pool.submit(run_hopper, binary, 1, copies_late, wgmma_late,
                                                        cases=HOPPER_MUTANT_CASES.get(name, HOPPER_CASES),
                                                        conv_cases=0, pinned=True, planted=number)
        for number, name in launch_bugs:
            jobs[("launch mutant", name)] = pool.submit(run_hopper, launch_binary, 1, False, False,
                                                        cases=LAUNCH_MUTANT_CASES.get(name, HOPPER_CASES),
                                                        conv_cases=0, planted=number)
        for number, name in fold_bugs:
            jobs[("fold mutant", name)] = pool.submit(run_hopper, launch_binary, 1, False, False, cases=0,
                                                      conv_cases=0, planted=number)
        for name, (_, _, (copies_late, wgmma_late), _, planted_pass) in CONV_MUTATIONS.items():
            binary, number = conv_planted_binaries[name]
            jobs[("conv mutant", name)] = pool.submit(run_hopper, binary, 1, copies_late, wgmma_late, cases=0,
                                                      conv_cases=CONV_MUTANT_CASES.get(name, HOPPER_CONV_CASES),
                                                      pinned=planted_pass is not None, planted=number)
        return {key: job.result() for key, job in jobs.items()}


@pytest.mark.parametrize("arch,late", RUNS, ids=[f"sm{a // 10}-{'late' if l else 'early'}-copies" for a, l in RUNS])
@pytest.mark.parametrize("seeded", ["fixed", "random"])
def test_kernels_match_reference(results, arch, late, seeded):
    seed = FIXED_SEEDS[(arch, late)] if seeded == "fixed" else SEED
    code, output = results[(arch, late, seed)]
    print(f"seed {seed}\n{output}")
    replay = f"replay: {arch=} {late=} seed={seed} (MPGEMM_TEST_SEED={SEED})"
    assert code == 0, f"{replay}\n{output[-12000:]}"
    assert f"gemm: 0/{GEMM_CASES} failed" in output, replay
    assert re.search(r"gemm plans: 0/\d+ failed", output), replay
    assert f"unscale: 0/{UNSCALE_CASES} failed" in output, replay
    assert f"conv: 0/{CONV_CASES} failed" in output, replay
    assert f"conv kernels launched: {CONV_KERNELS[arch]}\n" in output, replay
    sliding = re.search(r"depthwise sliding wgrad: 0/12 failed \((\d+) kernels; (\d+) split, (\d+) on a clipped grid, "
                        r"(\d+) striding over tiles\)", output)
    assert sliding and int(sliding[1]) == SLIDING_KERNELS[arch], replay
    assert int(sliding[2]) >= 3 and int(sliding[3]) >= 1 and int(sliding[4]) >= 1, replay
    assert f"depthwise sliding gather: 0/18 failed ({GATHER_KERNELS[arch]} kernels; 4 on two tiles)" in output, replay
    n16 = re.search(r"conv n16 tile: 0/16 failed \((\d+) kernels; (\d+) on several row tiles\)", output)
    assert n16 and int(n16[2]) >= 4 and (arch < 800 or int(n16[1]) == N16_KERNELS), replay
    assert printed_count(output, "wgrad cases that split K") > 0, replay
    # fprop's epilogue moments (conv_cases.cpp), their kernels counted apart.
    assert printed_count(output, "fprop cases with moments") > 0, replay
    # 1x1 convolutions through the GEMM (MPGEMM_CONV_PATH=gemm), wgrad's long K split on WMMA tiles.
    assert re.search(r"conv as gemm: 0/12 failed \([1-9]\d* splitting K\)", output), replay
    assert "ceiling: 0/3 failed" in output, replay
    assert f"batch norm: 0/{BATCH_NORM_CASES} failed" in output, replay
    assert f"gated: 0/{BATCH_NORM_CASES} failed" in output, replay
    assert f"layer norm: 0/{BATCH_NORM_CASES} failed" in output, replay
    assert f"batch norm line finish: 0/{LINE_FINISH_CASES} failed" in output, replay


def test_simulation_catches_an_early_read_of_a_pipeline_stage(results):
    code, output = results[("mutant", "an early read of a pipeline stage")]
    assert code != 0 and "gemm: 0/" not in output and "conv: 0/" not in output, output[-4000:]


def test_simulation_catches_a_warp_rows_column_moments_dropped(results):
    code, output = results[("mutant", "a warp row's column moments dropped")]
    assert code != 0 and re.search(r"batch (mean|variance)\[", output), output[-4000:]


@pytest.mark.parametrize("name", SLIDING_MUTATIONS)
def test_simulation_catches_a_planted_sliding_window_bug(results, name):
    code, output = results[("mutant", name)]
    assert code != 0 and "depthwise sliding case" in output and "dw[" in output, output[-4000:]
    assert "depthwise sliding wgrad: 0/" not in output, output[-4000:]
    assert "depthwise sliding gather: 0/18 failed" in output, output[-4000:]


@pytest.mark.parametrize("name", N16_MUTATIONS)
def test_simulation_catches_a_planted_n16_tile_bug(results, name):
    code, output = results[("mutant", name)]
    assert code != 0 and "n16 tile case 9 FAILED" in output and "dx[" in output, output[-4000:]
    assert "depthwise sliding wgrad: 0/12 failed" in output, output[-4000:]
    assert "depthwise sliding gather: 0/18 failed" in output, output[-4000:]


@pytest.mark.parametrize("name", GATHER_MUTATIONS)
def test_simulation_catches_a_planted_sliding_gather_bug(results, name):
    code, output = results[("mutant", name)]
    message = GATHER_MUTATIONS[name][2]
    assert code != 0 and "depthwise sliding gather case" in output and message in output, output[-4000:]
    assert "depthwise sliding gather: 0/" not in output, output[-4000:]
    # The window read forwards breaks dgrad's cases alone; both leave the sliding wgrad alone.
    if "forwards" in name:
        assert "FAILED: err=0 fprop" not in output and "FAILED: err=0 dgrad" in output, output[-4000:]
    assert "depthwise sliding wgrad: 0/12 failed" in output, output[-4000:]


def test_simulation_catches_an_early_read_on_the_n16_tile(results):
    code, output = results[("mutant", "an early read of a pipeline stage", "n16")]
    assert code != 0 and "n16 tile case" in output and "conv n16 tile: 0/" not in output, output[-4000:]


@pytest.mark.parametrize("name", BATCH_NORM_MUTATIONS)
def test_simulation_catches_a_planted_elementwise_pass_bug(results, name):
    code, output = results[("batch norm mutant", name)]
    if name in LINE_FINISH_MUTATIONS:
        cases, count = "batch norm line finish", LINE_FINISH_CASES
    else:
        cases = "gated" if name in GATED_MUTATIONS else "layer norm" if name in LAYER_NORM_MUTATIONS else "batch norm"
        count = BATCH_NORM_MUTANT_CASES
    assert code != 0 and re.search(cases + rf": [1-9]\d*/{count} failed", output), output[-4000:]


HOPPER_RUN_IDS = [f"copies-{'late' if c else 'early'}-wgmma-{'late' if w else 'early'}" for c, w in HOPPER_RUNS]


def hopper_run(results, copies_late, wgmma_late):
    """(output, replay line) of a Hopper run, which must have exited cleanly."""
    seed = HOPPER_RUNS[(copies_late, wgmma_late)]
    code, output = results[("hopper", copies_late, wgmma_late)]
    print(f"seed {seed}\n{output}")
    replay = f"replay: hopper {copies_late=} {wgmma_late=} seed={seed} (MPGEMM_TEST_SEED={SEED})"
    assert code == 0, f"{replay}\n{output[-12000:]}"
    return output, replay


@pytest.mark.parametrize("copies_late,wgmma_late", HOPPER_RUNS, ids=HOPPER_RUN_IDS)
def test_hopper_gemm_matches_reference_and_the_ptx_models(results, copies_late, wgmma_late):
    output, replay = hopper_run(results, copies_late, wgmma_late)
    assert re.search(r"layout: 0/\d+ mismatches", output), replay
    assert f"gemm: 0/{HOPPER_CASES} failed" in output, replay
    assert printed_count(output, "wgmma cases") >= HOPPER_MIN_WGMMA_CASES, replay
    assert printed_count(output, "wgmma_2x1 cases") == HOPPER_PAIR_CASES, replay
    assert printed_count(output, "wgmma_pingpong cases") >= HOPPER_MIN_PING_PONG_CASES, replay
    assert printed_count(output, "wgmma_n128 cases") >= 1 and printed_count(output, "wgmma_n64 cases") >= 1, replay
    assert printed_count(output, "wgmma split-K cases") >= 1, replay
    assert printed_count(output, "wgmma cases on padded copies") >= 1, replay
    # The pre-activation beside D: from the wide tile's epilogue (K-major
    # operands), and where no epilogue stores it, from the product run again.
    assert printed_count(output, "wgmma cases storing the pre-activation from the epilogue") >= 2, replay
    assert printed_count(output, "wgmma cases storing the pre-activation from registers") >= 1, replay
    assert printed_count(output, "wgmma cases running the product again for the pre-activation") >= 1, replay
    # A's row sums beside D (linear's wgrad), whole K and split, and refused where a plan cannot sum them.
    assert printed_count(output, "wgmma cases summing A's rows") >= 1, replay
    assert printed_count(output, "wgmma split-K cases summing A's rows") >= 1, replay
    assert "row sums refused where the plan cannot sum them: ok" in output, replay
    # GELU's tanh form on its own pre-activation kernel, and refused where a plan has no such epilogue.
    assert "GELU's tanh form on its pre-activation kernel: 2 of 2 cases, refused elsewhere: ok" in output, replay
    # and on every other Hopper tile, forced, and ping-pong and 128 x 64 as the plan picks them.
    assert ("row sums on every Hopper tile: ok (wgmma_2x1 1, wgmma_pingpong 2, wgmma_n128 1, wgmma_n64 2)"
            in output), replay
    # D times an activation's derivative (an MLP's dgrad): from the wide
    # tile's epilogue, Z read in pairs and an element at a time, and from
    # ping-pong pairs'; and after the product: split-K's reduction, or a
    # pass over D.
    assert printed_count(output, "wgmma cases multiplying by the activation's derivative in the epilogue") >= 2, replay
    assert printed_count(output, "wgmma_pingpong cases multiplying by the activation's derivative in the epilogue") \
        >= 1, replay
    assert printed_count(output, "cases multiplying by the activation's derivative after the product") >= 2, replay
    copied_out = printed_count(output, "wgmma cases storing through the copy engine")
    assert HOPPER_MIN_COPIED_OUT_CASES <= copied_out, replay
    assert copied_out < printed_count(output, "wgmma cases"), replay
    assert "cluster occupancy asked once per device and kernel: ok" in output, replay
    # Stream-K: eight cases whose tiles span 2 to 10 runs, four on the wide
    # tile and four on the narrow ones, each split tile's slots added by
    # the block that ends it (at least 14 over the wide four, 16 over the
    # narrow four, at the ends of their ranges).
    stream_k = re.search(r"stream-K on the wide and narrow tiles: ok \(8 cases, (\d+) slots added\)", output)
    assert stream_k and int(stream_k.group(1)) >= 30, replay


@pytest.mark.parametrize("copies_late,wgmma_late", HOPPER_RUNS, ids=HOPPER_RUN_IDS)
def test_hopper_conv_matches_reference_and_the_im2col_model(results, copies_late, wgmma_late):
    output, replay = hopper_run(results, copies_late, wgmma_late)
    assert re.search(r"im2col walk: 0/\d+ mismatches", output), replay
    assert f"conv: 0/{HOPPER_CONV_CASES} failed" in output, replay
    assert printed_count(output, "conv wgmma cases") >= HOPPER_MIN_CONV_WGMMA_CASES, replay
    assert printed_count(output, "conv wgmma cases by default") > 0, replay
    assert printed_count(output, "conv wgmma wgrad cases that split") > 0, replay
    assert printed_count(output, "conv wgmma cases on wgmma_n128") > 0, replay
    assert printed_count(output, "conv wgmma cases on wgmma_n64") > 0, replay
    assert printed_count(output, "conv wgmma wgrad cases on wgmma_m64 that split") > 0, replay
    assert printed_count(output, "conv wgmma wgrad cases on wgmma_m64") > \
        printed_count(output, "conv wgmma wgrad cases on wgmma_m64 that split"), replay
    assert printed_count(output, "conv wgmma dgrad cases with a stride") > 0, replay
    assert printed_count(output, "conv wgmma dgrad cases with a phase no tap reaches") > 0, replay
    assert printed_count(output, "conv wgmma dgrad cases with their rows staged") > 0, replay
    # A strided dgrad's phases in one launch: a 1x1's (three phases stored as zeros) and a 3x3's (four of
    # 1 to 4 taps).
    one_launch_unreached = printed_count(output, "conv wgmma dgrad cases in one launch with a phase no tap reaches")
    assert printed_count(output, "conv wgmma dgrad cases with their phases in one launch") > one_launch_unreached > 0, \
        replay
    # fprop's column moments from the consumers' strips (sm90/epilogue.cuh), checked in every case that wrote
    # them: on each tile, and in some random cases.
    assert "column moments on each tile: ok" in output, replay
    assert printed_count(output, "conv fprop cases with moments") >= 3, replay
    # dgrad at stride 1 adding an addend in its epilogue (MPGEMM_DGRAD_ADDEND=1), in the cases that ask.
    assert printed_count(output, "conv wgmma dgrad cases with an addend") > 0, replay
    assert "bad MPGEMM_CONV_PATH refused: ok" in output, replay
    assert ("bad MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD, MPGEMM_GATHERED_FOLD, "
            "MPGEMM_M64_TILE and MPGEMM_DGRAD_ADDEND refused: ok") in output, replay
    assert "taps at the im2col offsets' limit: ok" in output, replay
    assert "wgrad splits on 132 multiprocessors: ok" in output, replay
    # Few-channel fprop and wgrad on folded taps (conv/folded_taps.h), and
    # the random cases' own folds (their few channels, where the taps fold).
    assert f"conv on folded taps: 0/{HOPPER_CONV_CASES // 5} failed" in output, replay
    assert printed_count(output, "conv cases on folded taps") >= HOPPER_CONV_CASES // 5, replay
    assert printed_count(output, "conv wgrad cases on folded taps on wgmma_m64") > 0, replay
    # x folded in 16-byte chunks (the default) in a third of the folded cases of a pass, gathered
    # by the producer (MPGEMM_GATHERED_FOLD=1) in another third, and both folds of x on their own
    # against the fold's definition.
    assert printed_count(output, "conv cases on folded taps in chunks") >= 2, replay
    assert printed_count(output, "conv cases on folded taps gathered") >= 2, replay
    assert "x's folds by elements and in chunks: ok" in output, replay
    assert re.search(rf"conv as gemm: 0/{HOPPER_CONV_CASES // 3} failed \([1-9]\d* on the Hopper GEMM\)", output), \
        replay
    # A thread's first launch binds the device's context before the driver's encoders run.
    assert "first Hopper launches on fresh threads: ok" in output, replay


@pytest.mark.parametrize("name", HOPPER_MUTATIONS)
def test_hopper_simulation_catches_a_planted_pipeline_bug(results, name):
    code, output = results[("hopper mutant", name)]
    assert code != 0 and any(text in output for text in HOPPER_MUTATIONS[name][2].split("|")), output[-4000:]


@pytest.mark.parametrize("name", GEMM_LAUNCH_MUTATIONS)
def test_hopper_simulation_catches_a_planted_launcher_bug(results, name):
    code, output = results[("launch mutant", name)]
    assert code != 0 and GEMM_LAUNCH_MUTATIONS[name][1] in output and "FAILED" in output, output[-4000:]


@pytest.mark.parametrize("name", FOLD_MUTATIONS)
def test_hopper_simulation_catches_a_planted_fold_bug(results, name):
    code, output = results[("fold mutant", name)]
    assert code != 0 and any(text in output for text in FOLD_MUTATIONS[name][1].split("|")), output[-4000:]


@pytest.mark.parametrize("name", CONV_MUTATIONS)
def test_hopper_simulation_catches_a_planted_conv_bug(results, name):
    code, output = results[("conv mutant", name)]
    assert code != 0 and any(text in output for text in CONV_MUTATIONS[name][3].split("|")), output[-4000:]
