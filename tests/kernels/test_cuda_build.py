"""CUDA build check: the full CUDA extension (CPU reference plus the kernels;
conftest.py's cuda_build, shared with the SASS checks) compiles, links and
imports on a machine without a GPU, and every op has a CUDA kernel
registered. The Hopper GEMM's sm_90a code in the built library
is read back: wgmma (HGMMA) in its mainloop and no mma.sync, the copy engine
(UTMALDG), mbarriers (SYNCS) and register reallocation, an epilogue that
writes shared memory with shared stores (STS), fences it for the copy engine
and stores it with the copy engine (UTMASTG) for two output types only (fp32
and the inputs' own), no spills, and no ptxas
advisory that it serialized the wgmmas or ignored setmaxnreg; the
kernels for pairs of blocks multicast their copies, arrive on the other
block's mbarriers and meet at a cluster barrier, with no memory fence in the
mainloop. The narrow tiles' kernels (128 x 128 and 128 x 64) issue wgmmas
of their width and store as many strips as their columns fill; the split-K
kernels are the 128 x 256 block with their copies offset along K; the
kernels that sum A's rows (every tile's, whole K, and the split one) add a
64 x 8 wgmma to each k16 step of their first column's mainloop. The Hopper
convolution's kernels (fprop, dgrad, wgrad, on each of the three tiles
blocks alone run) are the same block fed by the copy engine's im2col loads
(UTMALDG.4D.IM2COL) and tiled loads of the filters (wgrad: of dy); its
dgrad kernels that stage a strided phase's rows, and those that run all of
a strided dgrad's phases in one launch, store no strip through the copy
engine but read each back with 16-byte shared loads (LDS.128) and store it
with 16-byte global stores (STG.E.128), four of each a strip.
The fprop kernels that write column moments for batch norm combine lanes
with shuffles and no atomics (the Hopper ones read their strips back, a
whole strip's loads issued before any is summed).
The fused batch norm's kernels (mpgemm.fuse) load 16 bytes at a time in
their 16-byte variants (the elementwise ones store so too) and round every
step on its own (no FFMA), as the CPU backend does; those that load rows
ahead (MPGEMM_BATCH_NORM_LOADS_AHEAD=1) issue 4 rows' 16-byte loads in each
row loop before any instruction reads one, and the finish by lines
(MPGEMM_BATCH_NORM_FINISH_BY_LINES=1) issues all 16 loads of a thread's
partials before any instruction reads one. The gated MLP's passes
load and store 16 bytes at a time; layer norm's row passes too in their
16-byte variants (each row's sums a butterfly of shuffles, no atomics), and
its weights' sums issue 4 rows' loads before the first sum. x's fold in chunks (folded taps,
MPGEMM_CHUNKED_FOLD=1) stores each thread's 8 channels with one 16-byte
store. The folded taps' kernels whose producer gathers x's fold itself
(MPGEMM_GATHERED_FOLD=1) are the convolution's block with no im2col copy,
the producer's own loads and fenced shared stores, and its registers.
Depthwise wgrad on the sliding window (MPGEMM_DEPTHWISE_SLIDING_WGRAD=1)
loads each column of x and each pixel's dy once, 8 bytes at a time, and
converts each loaded element to fp32 once; the depthwise gather on the
sliding window (MPGEMM_DEPTHWISE_SLIDING_GATHER=1) loads each column under
a filter row once, 16 bytes at a time, and neither spills.
"""

import collections
import re

import pytest

from mpgemm.tools import sass


def test_imports_the_cuda_build(cuda_build):
    assert cuda_build["module"].startswith(cuda_build["src"])
    info = cuda_build["build_info"]
    assert info["backend"] == "cuda"
    # 9.0 is built as sm_90a, whose code alone has the Hopper GEMM (setup.py).
    expected = sorted("sm_" + arch.replace(".", "") + ("a" if arch == "9.0" else "")
                      for arch in cuda_build["requested_archs"].split(";"))
    assert info["cuda_archs"] == expected


def test_every_op_has_a_cuda_kernel(cuda_build):
    assert cuda_build["ops"], "no mpgemm ops registered"
    missing = [op for op, has_kernel in cuda_build["ops"].items() if not has_kernel]
    assert not missing, f"ops without a CUDA kernel: {missing}"


def test_cpu_reference_in_the_cuda_build(cuda_build):
    assert cuda_build["cpu_error"] < 1e-2


def test_no_spill_warnings(cuda_build):
    # setup.py passes -Xptxas=-warn-spills to nvcc.
    assert "spill" not in cuda_build["log"].lower().replace("warn-spills", "")


@pytest.fixture(scope="module")
def hopper_kernels(cuda_build, machine_code):
    """{kernel name: [sass.Instruction]} of the Hopper GEMM kernels in the built library's sm_90a code."""
    if "sm_90a" not in cuda_build["build_info"]["cuda_archs"]:
        pytest.skip("the build has no sm_90a code")
    kernels = {name: instructions for name, instructions in machine_code[0]["sm_90a"].items()
               if "wgmma_gemm_kernel" in name}
    # Two input types by four operand layouts by five kernels: blocks alone
    # on 128 x 256, 128 x 128 and 128 x 64 tiles, pairs, pairs with ping-pong
    # consumers.
    assert len(kernels) == 40, sorted(kernels)
    assert sum(is_one_of(PAIR_KERNEL, name) for name in kernels) == 16, sorted(kernels)
    assert sum(is_one_of(PING_PONG_KERNEL, name) for name in kernels) == 8, sorted(kernels)
    assert {tile_width(name) for name in kernels} == {256, 128, 64}, sorted(kernels)
    return kernels


# The Hopper tiles (common/tile_configs.h) of the kernels for pairs of blocks,
# as their mangled names spell them; ping-pong's pairs too.
PAIR_KERNEL = ("13WgmmaPairTile", "17WgmmaPingPongTile")
PING_PONG_KERNEL = ("17WgmmaPingPongTile",)
# The narrow tiles, by width.
NARROW_KERNEL = {"13WgmmaN128Tile": 128, "12WgmmaN64Tile": 64}


def is_one_of(parts, name):
    return any(part in name for part in parts)


def tile_width(name):
    """The columns of a Hopper kernel's tile: its wgmma's N."""
    return next((width for part, width in NARROW_KERNEL.items() if part in name), 256)


def strips_per_tile(width):
    """The output strips of a tile `width` columns wide, in its epilogues of
    two output types, fp32 (a strip per 32 columns: 8 a 256-column tile) and
    the inputs' own (per 64: 4), once each: bias and activation come before
    the stores, so that the activations do not multiply the stores' code
    (bench/NOTES.md, "The Hopper epilogue's code")."""
    return width // 32 + width // 64


def check_hopper_block(name, instructions, staged_rows=False, outputs=1):
    """What every Hopper kernel's block (sm90/block.cuh) compiles to, its
    epilogue through the copy engine (`outputs` of them: D, and the
    pre-activation where it is stored too), or with `staged_rows` (strided
    dgrad's kernels that stage their rows) through shared memory and 16-byte
    stores; its mainloop's span (sass.MainloopMix)."""
    opcodes = [i.opcode for i in instructions]
    width = tile_width(name)
    hgmma = f"HGMMA.64x{width}x16.F32" + (".BF16" if "__nv_bfloat16" in name else "")
    assert {op for op in opcodes if op.startswith("HGMMA")} == {hgmma}, name
    assert sass.count_opcodes(opcodes, "HMMA") == 0, f"{name} runs mma.sync"
    mix = sass.mainloop_mix(instructions)
    # One K slice: four k16 steps, no global loads (the copy engine's) and no block barrier.
    assert mix is not None and mix.counts["hmma"] == 4, f"{name}: {mix}"
    assert mix.counts["global"] == 0 and mix.counts["barrier"] == 0, f"{name}: {mix.counts}"
    epilogue = ("LDS.128", "STG.E.128") if staged_rows else ("FENCE.VIEW.ASYNC.S", "UTMASTG.3D")
    for needed in ("UTMALDG", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "SYNCS.ARRIVE.TRANS64", "USETMAXREG.DEALLOC",
                   "USETMAXREG.TRY_ALLOC", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "STS.64",
                   "BAR.SYNC.DEFER_BLOCKING", *epilogue):
        assert sass.count_opcodes(opcodes, needed) > 0, f"{name} lacks {needed}"
    # Its strips are written through the shared window, not generic addresses.
    assert sass.count_opcodes(opcodes, "ST.E") == 0, f"{name} writes its output strips with generic stores"
    strips = strips_per_tile(width)
    if staged_rows:
        # Each strip met on once, then read back and stored a 16-byte chunk a thread, 4 rows of 16 apart.
        assert sass.count_opcodes(opcodes, "UTMASTG") == 0, f"{name} stores through the copy engine"
        assert sass.count_opcodes(opcodes, "LDS.128") == sass.count_opcodes(opcodes, "STG.E.128") == 4 * strips, name
        assert sass.count_opcodes(opcodes, "BAR.SYNC.DEFER_BLOCKING") >= strips, f"{name}: strip barriers"
    else:
        # Each strip fenced for the copy engine and met on twice (before it
        # is written, and before it is stored).
        stores = sass.count_opcodes(opcodes, "UTMASTG.3D")
        assert stores == outputs * strips, f"{name}: {stores} strip stores"
        assert sass.count_opcodes(opcodes, "FENCE.VIEW.ASYNC.S") >= stores, f"{name}: a strip stored unfenced"
        assert sass.count_opcodes(opcodes, "BAR.SYNC.DEFER_BLOCKING") >= 2 * stores, f"{name}: strip barriers"
    body = [i.opcode for i in instructions if mix.start <= i.address <= mix.end]
    assert not [op for op in body if op.startswith("MEMBAR")], f"{name} fences memory in its mainloop"


def test_hopper_mainloop_runs_wgmma_on_copies_the_copy_engine_made(hopper_kernels):
    for name, instructions in hopper_kernels.items():
        check_hopper_block(name, instructions)
        opcodes = [i.opcode for i in instructions]
        # Pairs: B's copies multicast, stages handed back to the other block
        # (a remote arrival), and a cluster barrier before the first of either.
        pair_only = ("UTMALDG.3D.MULTICAST", "SYNCS.ARRIVE.TRANS64.RED", "UCGABAR_ARV", "UCGABAR_WAIT")
        for op in pair_only:
            assert (sass.count_opcodes(opcodes, op) > 0) == is_one_of(PAIR_KERNEL, name), f"{name}: {op}"
        # Ping-pong: each consumer's turn to run its mainloop, handed on
        # with bar.arrive, met with bar.sync.
        assert (sass.count_opcodes(opcodes, "BAR.ARV") > 0) == is_one_of(PING_PONG_KERNEL, name), f"{name}: BAR.ARV"


SPLIT_K_KERNEL, GEMM_KERNEL = "wgmma_splitk_gemm_kernel", "wgmma_gemm_kernel"


def renamed(name, kernel, other):
    """A mangled kernel name with `kernel` replaced by `other` (the names spell each one's length before it)."""
    return name.replace(f"{len(kernel)}{kernel}", f"{len(other)}{other}")


def check_beside_whole_k(machine_code, hopper_kernels, kernel, count, layouts, opcodes, outputs=1,
                         tiles=("9WgmmaTile",)):
    """The `count` Hopper kernels named `kernel` (two input types, on each of
    `tiles`, by default the 128 x 256 tile alone, on `layouts`, e.g.
    "ELb1ELb0E": A K-major, B not), each the block (check_hopper_block, its
    strips stored `outputs` times) with no spills and as many of `opcodes` as
    the whole-K kernel of the same template arguments. Returns [(its
    instructions, the whole-K kernel's, its tile)]."""
    code, usage = machine_code[0]["sm_90a"], machine_code[1]["sm_90a"]
    kernels = {name: instructions for name, instructions in code.items() if kernel in name}
    assert len(kernels) == count, sorted(kernels)
    for tile in tiles:
        assert sum(f"{tile}{layouts}" in name for name in kernels) == count // len(tiles), (tile, sorted(kernels))
    pairs = []
    for name, instructions in kernels.items():
        check_hopper_block(name, instructions, outputs=outputs)
        res = usage.get(name, {})
        assert res and res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{name}: {res}"
        # The whole-K kernel of the same template arguments (its parameters may differ: fewer tensor maps).
        arguments = renamed(name.split("EEEv")[0], kernel, GEMM_KERNEL)
        whole_k = next(k for k in hopper_kernels if k.startswith(arguments + "EEEv"))
        ops, whole_k_ops = ([i.opcode for i in k] for k in (instructions, hopper_kernels[whole_k]))
        for op in opcodes:
            assert sass.count_opcodes(ops, op) == sass.count_opcodes(whole_k_ops, op), f"{name}: {op}"
        pairs.append((ops, whole_k_ops, next(tile for tile in tiles if tile in name)))
    return pairs


def test_split_k_kernels_are_the_unsplit_block_with_its_copies_offset(hopper_kernels, machine_code):
    """The Hopper GEMM's split-K kernels (by default where they pay):
    two input types by four layouts, on the 128 x 256 tile alone, each the
    block its unsplit kernel runs: the same HGMMA, copies and stores, the
    copies' K coordinates offset by the split (a few integer instructions
    more), and no spills."""
    for split_ops, unsplit_ops, _ in check_beside_whole_k(
            machine_code, hopper_kernels, SPLIT_K_KERNEL, 8, "",
            ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS.ARRIVE.TRANS64", "BAR.SYNC.DEFER_BLOCKING")):
        assert abs(len(split_ops) - len(unsplit_ops)) < 64, f"{len(split_ops)} against {len(unsplit_ops)}"


STREAM_K_KERNEL = "wgmma_stream_k_gemm_kernel"
# The tiles with stream-K kernels, and the 16-byte words of a consumer's
# slot each thread writes and reads back: its 64 x N fp32 sums over 128
# threads, 4 a word.
STREAM_K_SLOT_WORDS = {"9WgmmaTile": 32, "13WgmmaN128Tile": 16, "12WgmmaN64Tile": 8}


def test_stream_k_kernels_are_the_whole_k_block_with_its_fix_up(hopper_kernels, machine_code):
    """The Hopper GEMM's stream-K kernels (opt-in, MPGEMM_STREAM_K=1): two
    input types by four layouts on the 128 x 256 tile and on the narrow
    128 x 128 and 128 x 64 ones, each the block its whole-K kernel runs
    (the same HGMMA, copies and strip stores, no spills) and the fix-up
    after its mainloop: a consumer's 64 x N sums written to its slot, and
    another block's read back, 16 bytes at a time through L2 (32, 16 or 8
    of each); the flag raised by one release add after the warpgroup's
    barrier and a GPU-wide fence, and waited for by an acquire load that
    drops L1's lines before the barrier that precedes the slot's loads."""
    for ops, _, tile in check_beside_whole_k(machine_code, hopper_kernels, STREAM_K_KERNEL, 24, "",
                                             ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS.ARRIVE.TRANS64"),
                                             tiles=tuple(STREAM_K_SLOT_WORDS)):
        words = STREAM_K_SLOT_WORDS[tile]
        assert sass.count_opcodes(ops, "STG.E.128.STRONG.GPU") == words, "the slot written"
        assert sass.count_opcodes(ops, "LDG.E.128.STRONG.GPU") == words, "a slot read back"
        assert sass.count_opcodes(ops, "REDG.E.ADD.S32.STRONG.GPU") == 1, "the flag raised"
        assert sass.count_opcodes(ops, "LDG.E.STRONG.GPU") == 1, "the flag waited for"
        at = {op: [i for i, o in enumerate(ops) if o == op] for op in (
            "STG.E.128.STRONG.GPU", "LDG.E.128.STRONG.GPU", "REDG.E.ADD.S32.STRONG.GPU", "LDG.E.STRONG.GPU",
            "MEMBAR.ALL.GPU", "CCTL.IVALL", "BAR.SYNC.DEFER_BLOCKING")}
        bars, raised, seen = at["BAR.SYNC.DEFER_BLOCKING"], at["REDG.E.ADD.S32.STRONG.GPU"][0], at["LDG.E.STRONG.GPU"][0]
        # Release: the warpgroup's stores, its barrier, a GPU-wide fence, then the flag.
        met = max(i for i in bars if i < raised)
        assert max(at["STG.E.128.STRONG.GPU"]) < met < max(i for i in at["MEMBAR.ALL.GPU"] if i < raised), "release"
        # Acquire: the flag's load, L1 dropped, the barrier, then the slot's loads.
        handed = min(i for i in bars if i > seen)
        assert any(seen < i < handed for i in at["CCTL.IVALL"]) and handed < min(at["LDG.E.128.STRONG.GPU"]), "acquire"


PRE_ACTIVATION_KERNEL = "wgmma_pre_activation_gemm_kernel"


def test_pre_activation_kernels_store_twice_from_the_unsplit_block(hopper_kernels, machine_code):
    """The Hopper GEMM kernels that store the pre-activation beside D (the
    default's for GELU; MPGEMM_EPILOGUE_PRE_ACTIVATION=0 turns them off): two input types, K-major operands, on
    the 128 x 256 tile alone, each the block of its whole-K kernel (the same
    HGMMA and copies) with twice its output strips' stores, and no spills."""
    check_beside_whole_k(machine_code, hopper_kernels, PRE_ACTIVATION_KERNEL, 2, "ELb1ELb1E",
                         ("HGMMA", "UTMALDG", "SYNCS.ARRIVE.TRANS64"), outputs=2)


PRE_ACTIVATION_GELU_TANH_KERNEL = "wgmma_pre_activation_gelu_tanh_gemm_kernel"


def test_gelu_tanh_pre_activation_kernels_store_twice_and_take_tanh(hopper_kernels, machine_code):
    """The pre-activation kernels whose activation is GELU's tanh form
    (mpgemm.mlp's GPT-2 form, opt-in with MPGEMM_EPILOGUE_PRE_ACTIVATION=1
    until they pass the GPU tests): two input types, K-major operands, on
    ping-pong pairs alone, each the block of its whole-K kernel with twice
    its output strips' stores, and no spills; tanhf as nvcc 13 builds it
    (exponentials and reciprocals), where the erf form takes few
    reciprocals: at least 128 MUFU.RCP, one a thread's accumulator."""
    for ops, _, _ in check_beside_whole_k(machine_code, hopper_kernels, PRE_ACTIVATION_GELU_TANH_KERNEL, 2,
                                          "ELb1ELb1E", ("HGMMA", "UTMALDG", "SYNCS.ARRIVE.TRANS64"), outputs=2,
                                          tiles=("17WgmmaPingPongTile",)):
        assert sass.count_opcodes(ops, "MUFU.EX2") >= 128 and sass.count_opcodes(ops, "MUFU.RCP") >= 128


ACTIVATION_GRAD_KERNEL = "wgmma_activation_grad_gemm_kernel"


# The activation derivative's tiles: blocks alone, and pairs whose consumers take tiles in turn.
ACTIVATION_GRAD_TILES = ("9WgmmaTile", "17WgmmaPingPongTile")


def test_activation_grad_kernels_read_z_in_the_unsplit_blocks_epilogue(hopper_kernels, machine_code):
    """The Hopper GEMM kernels that multiply D by an activation's derivative
    (opt-in, MPGEMM_EPILOGUE_ACTIVATION_GRAD=1): two input types, a K-major A
    and an MN-major B (an MLP's dgrad), on the 128 x 256 tile of blocks alone
    and on ping-pong pairs, each the block of its whole-K kernel (the same
    HGMMA, copies and strip stores) whose epilogue loads Z from global memory
    and takes GELU's exponential, and no spills."""
    for ops, _, _ in check_beside_whole_k(machine_code, hopper_kernels, ACTIVATION_GRAD_KERNEL, 4, "ELb1ELb0E",
                                       ("HGMMA", "UTMALDG", "SYNCS.ARRIVE.TRANS64", "UTMASTG"),
                                       tiles=ACTIVATION_GRAD_TILES):
        assert sass.count_opcodes(ops, "LDG") > 0 and sass.count_opcodes(ops, "MUFU.EX2") > 0


def test_activation_grad_epilogue_loads_z_before_using_it(machine_code):
    """The activation derivative's epilogue (sm90/epilogue.cuh's
    multiply_by_activation_grad) issues a thread's loads of Z ahead of the
    derivatives, so that a tile waits on global memory twice: inside D, its
    64 words (a consumer's 64 x 256 tile) in two runs of 32; at D's edges,
    its 128 elements in runs of at least 8 (nvcc 13.2: 64 and 64 on blocks
    alone, 48, 16, 50 and 14 on ping-pong pairs). At fe39419 every load was
    waited on before the next was issued: runs of 1, 64 round trips a
    tile."""
    code = machine_code[0].get("sm_90a")
    if code is None:
        pytest.skip("the build has no sm_90a code")
    kernels = {name: instructions for name, instructions in code.items() if ACTIVATION_GRAD_KERNEL in name}
    assert len(kernels) == 2 * len(ACTIVATION_GRAD_TILES), sorted(kernels)
    for name, instructions in kernels.items():
        words, elements = ([run for run in load_runs(instructions, load) if run]
                           for load in ("LDG.E", "LDG.E.U16"))
        assert words == [32, 32], f"{name}: {words}"
        assert sum(elements) == 128 and min(elements) >= 8, f"{name}: {elements}"


ROW_SUMS_KERNELS = {"wgmma_row_sums_gemm_kernel": GEMM_KERNEL, "wgmma_splitk_row_sums_gemm_kernel": SPLIT_K_KERNEL}


def check_row_sums_kernel(name, instructions, plain):
    """A kernel that sums A's rows beside D against `plain`, the kernel of
    the same arguments without: two mainloops, its own and, for the first
    column of tiles, one whose every 64 x N x 16 HGMMA is followed by a
    64 x 8 x 16 one against the tile of ones, issued back to back (no wait
    between a slice's HGMMAs: a wgmma under a branch that ptxas cannot
    prove uniform has it serialize every wgmma of the kernel, its warning
    C7520); the same copies and strip stores as `plain`. `wide` is the
    tile's own width (256, or the narrow tiles' 128 and 64)."""
    bf16 = ".BF16" if "__nv_bfloat16" in name else ""
    wide, narrow = f"HGMMA.64x{tile_width(name)}x16.F32{bf16}", f"HGMMA.64x8x16.F32{bf16}"
    ops, plain_ops = [i.opcode for i in instructions], [i.opcode for i in plain]
    assert {op for op in ops if op.startswith("HGMMA")} == {wide, narrow}, name
    assert sass.count_opcodes(ops, wide) == 2 * sass.count_opcodes(plain_ops, wide) == 8, name
    assert sass.count_opcodes(ops, narrow) == 4 and sass.count_opcodes(ops, "HMMA") == 0, name
    mix = sass.mainloop_mix(instructions)  # the row sums' loop: the most HGMMAs
    body = [i.opcode for i in instructions if mix.start <= i.address <= mix.end]
    issued = [k for k, op in enumerate(body) if op.startswith("HGMMA")]
    assert [body[k] for k in issued] == [wide, narrow] * 4, f"{name}: {[body[k] for k in issued]}"
    assert not [op for op in body[issued[0]:issued[-1]] if op.startswith("WARPGROUP")], f"{name} waits between"
    assert mix.counts["global"] == 0 and mix.counts["barrier"] == 0, f"{name}: {mix.counts}"
    for op in ("UTMALDG", "UTMASTG"):
        assert sass.count_opcodes(ops, op) == sass.count_opcodes(plain_ops, op), f"{name}: {op}"


def test_row_sums_kernels_add_a_narrow_wgmma_to_each_k16_of_the_first_column_of_tiles(machine_code):
    """The Hopper GEMM kernels that sum A's rows beside D (opt-in,
    MPGEMM_EPILOGUE_BIAS_GRAD=1: linear's wgrad with its bias's gradient):
    two input types, MN-major operands, whole K on each of the five Hopper
    tiles (blocks alone, pairs, ping-pong, 128 x 128, 128 x 64) and split on
    the 128 x 256 tile of blocks alone, each its plain kernel's block with
    the row sums' mainloop beside its own, and no spills."""
    code, usage = machine_code[0].get("sm_90a"), machine_code[1].get("sm_90a")
    if code is None:
        pytest.skip("the build has no sm_90a code")
    kernels = {name: instructions for name, instructions in code.items()
               if any(kernel in name for kernel in ROW_SUMS_KERNELS)}
    tiles = ("9WgmmaTile", *PAIR_KERNEL, *NARROW_KERNEL)
    assert len(kernels) == 12 and all("ELb0ELb0E" in name for name in kernels), sorted(kernels)
    for tile in tiles:
        split = tile == "9WgmmaTile"
        assert sum(f"{tile}ELb0ELb0E" in name for name in kernels) == (4 if split else 2), (tile, sorted(kernels))
    for name, instructions in kernels.items():
        res = usage.get(name, {})
        assert res and res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{name}: {res}"
        # The mangled names spell each name's length before it; the parameters are the same.
        kernel, plain = next((k, p) for k, p in ROW_SUMS_KERNELS.items() if f"{len(k)}{k}" in name)
        check_row_sums_kernel(name, instructions, code[renamed(name, kernel, plain)])


STAGED_ROWS_KERNEL = "wgmma_dgrad_staged_rows_kernel"
PHASES_KERNEL = "wgmma_dgrad_phases_kernel"
# The convolution's wgrad tile of at most 64 filters, whose consumers take 64 x 256 tiles in turn.
M64_KERNEL = "12WgmmaM64Tile"
MOMENTS_KERNEL = "wgmma_fprop_moments_kernel"
ADDEND_KERNEL = "wgmma_dgrad_addend_kernel"


@pytest.fixture(scope="module")
def hopper_conv_kernels(cuda_build, machine_code):
    """{kernel name: [sass.Instruction]} of the Hopper convolution's kernels in the sm_90a code: fprop, dgrad
    and wgrad, dgrad staging its rows (a launch a phase, and its phases in one launch), and fprop writing its
    column moments, and dgrad adding an addend to dx, fp16 and bf16, on each tile."""
    if "sm_90a" not in cuda_build["build_info"]["cuda_archs"]:
        pytest.skip("the build has no sm_90a code")
    kernels = {name: instructions for name, instructions in machine_code[0]["sm_90a"].items()
               if "wgmma_conv_kernel" in name or STAGED_ROWS_KERNEL in name or PHASES_KERNEL in name
               or MOMENTS_KERNEL in name or ADDEND_KERNEL in name}
    assert len(kernels) == 44, sorted(kernels)
    assert sum(STAGED_ROWS_KERNEL in name for name in kernels) == 6, sorted(kernels)
    assert sum(PHASES_KERNEL in name for name in kernels) == 6, sorted(kernels)
    assert sum(MOMENTS_KERNEL in name for name in kernels) == 6, sorted(kernels)
    assert sum(ADDEND_KERNEL in name for name in kernels) == 6, sorted(kernels)
    assert {tile_width(name) for name in kernels} == {256, 128, 64}, sorted(kernels)
    # The 64-row tile's: wgrad alone (ConvPass 2), fp16 and bf16.
    m64 = [name for name in kernels if M64_KERNEL in name]
    assert len(m64) == 2 and all("wgmma_conv_kernel" in name and "ConvPassE2E" in name for name in m64), m64
    return kernels


def test_hopper_conv_runs_wgmma_on_im2col_copies(hopper_conv_kernels):
    for name, instructions in hopper_conv_kernels.items():
        check_hopper_block(name, instructions, staged_rows=STAGED_ROWS_KERNEL in name or PHASES_KERNEL in name)
        opcodes = [i.opcode for i in instructions]
        # Activations through the copy engine's im2col mode; filters (wgrad: dy) through its tiled mode;
        # blocks alone.
        assert sass.count_opcodes(opcodes, "UTMALDG.4D.IM2COL") > 0, f"{name} lacks the im2col copy"
        assert sass.count_opcodes(opcodes, "UTMALDG.3D") > 0, f"{name} lacks its tiled copies"
        for op in ("UTMALDG.3D.MULTICAST", "UCGABAR_ARV"):
            assert sass.count_opcodes(opcodes, op) == 0, f"{name}: {op}"
        # The 64-row tile's consumers hand each turn on with bar.arrive (ping-pong); the others never do.
        assert (sass.count_opcodes(opcodes, "BAR.ARV") > 0) == (M64_KERNEL in name), f"{name}: BAR.ARV"


def test_dgrad_addend_kernels_add_it_loaded_ahead_in_the_plain_dgrads_epilogue(hopper_conv_kernels):
    """dgrad's kernels that add a second term to dx (opt-in,
    MPGEMM_DGRAD_ADDEND=1; sm90/epilogue.cuh's add_addend) are the plain
    dgrad kernel of their tile and type (the same HGMMA, copies and strip
    stores, and the bias's loads, which a dgrad never runs) with the
    addend's loads in the epilogue besides: inside D, a thread's words (a
    quarter of the tile's width: 64 on the 128 x 256 tile) in runs of 32, or
    all of them where it holds fewer, each issued before the first is added
    (nvcc 13.0: 32 and 32 on the wide tile, 32 on 128 x 128, 16 on 128 x
    64); at D's edges, two-byte loads of twice as many elements."""
    addend = {name: code for name, code in hopper_conv_kernels.items() if ADDEND_KERNEL in name}
    assert len(addend) == 6, sorted(addend)
    for name, instructions in addend.items():
        arguments = name.split("EEEv")[0].split("kernelI")[1]
        plain = next(code for other, code in hopper_conv_kernels.items()
                     if "wgmma_conv_kernel" in other and other.split("EEEv")[0].split("kernelI")[1] ==
                     f"{arguments}ELNS0_8ConvPassE1")
        ops, plain_ops = [i.opcode for i in instructions], [i.opcode for i in plain]
        for op in ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS.ARRIVE.TRANS64"):
            assert sass.count_opcodes(ops, op) == sass.count_opcodes(plain_ops, op), f"{name}: {op}"
        words_per_thread = tile_width(name) // 4
        for load, count in (("LDG.E", words_per_thread), ("LDG.E.U16", 2 * words_per_thread)):  # exact opcodes
            assert ops.count(load) - plain_ops.count(load) == count, f"{name}: {load}"
        # The runs of words the plain kernel does not have: the addend's.
        words = sorted((collections.Counter(run for run in load_runs(instructions, "LDG.E") if run)
                        - collections.Counter(run for run in load_runs(plain, "LDG.E") if run)).elements())
        assert sum(words) == words_per_thread and min(words) >= min(32, words_per_thread), f"{name}: {words}"


def test_column_moments_come_from_shuffles_in_a_fixed_order(cuda_build, machine_code, hopper_conv_kernels):
    """The kernels that write column moments (the Hopper fprop's, reading its
    strips back 4 bytes a thread, and the WMMA fprop's) combine lanes with
    butterfly shuffles and use no atomics (the same bits on every run)."""
    moments = {name: [i.opcode for i in instructions] for name, instructions in hopper_conv_kernels.items()
               if MOMENTS_KERNEL in name}
    for arch in cuda_build["build_info"]["cuda_archs"]:
        moments.update({name: [i.opcode for i in instructions] for name, instructions in machine_code[0][arch].items()
                        if "conv2d_fprop_moments_kernel" in name})
    assert sum("conv2d_fprop_moments_kernel" in name for name in moments) > 0, sorted(moments)
    for name, opcodes in moments.items():
        assert sass.count_opcodes(opcodes, "SHFL.BFLY") > 0, f"{name} lacks its shuffles"
        for op in ("ATOM", "ATOMG", "RED", "ATOMS"):
            assert sass.count_opcodes(opcodes, op) == 0, f"{name}: {op}"
        if MOMENTS_KERNEL in name:
            assert sass.count_opcodes(opcodes, "LDS") > 0, f"{name} does not read its strips back"


def test_column_moments_of_a_whole_strip_load_before_summing(hopper_conv_kernels):
    """The Hopper fprop kernels that write column moments read a whole strip's
    16 words a lane back with loads issued before any is summed
    (sm90/epilogue.cuh's strip_column_moments: 11 in a row, then the rest as
    registers free up; at fe39419 each load was waited on in turn, runs of
    1), for both output types a kernel stores (16-bit and fp32)."""
    moments = {name: code for name, code in hopper_conv_kernels.items() if MOMENTS_KERNEL in name}
    assert len(moments) == 6, sorted(moments)
    for name, code in moments.items():
        runs = load_runs(code)
        assert sum(run >= 8 for run in runs) >= 2, f"{name}: {runs}"


def test_hopper_kernels_neither_spill_nor_serialize(cuda_build, machine_code, hopper_kernels, hopper_conv_kernels):
    usage = machine_code[1]["sm_90a"]
    for name in [*hopper_kernels, *hopper_conv_kernels]:
        res = usage.get(name, {})
        assert res and res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{name}: {res}"
    # ptxas reports wgmmas it had to serialize, waits it injected and a
    # setmaxnreg it ignored as performance advisories (codes C75xx).
    advisories = [line for line in cuda_build["log"].splitlines()
                  if "Potential Performance Loss" in line or "is injected" in line or "(C75" in line]
    assert not advisories, "\n".join(advisories[:10])


def test_sm90a_code_alone_gives_the_probe_shared_memory(cuda_build, machine_code):
    # sm90/block.cuh's wgmma_compiled tells the loaded code by the probe's
    # static shared memory (a driver query, legal inside a graph capture):
    # at least kSm90aProbeSharedBytes (16) in each unit's sm_90a code, none in
    # any other arch's (the extension's others, the CMake library's sm_80),
    # so that such code's answer is no.
    if "sm_90a" not in cuda_build["build_info"]["cuda_archs"]:
        pytest.skip("the build has no sm_90a code")
    probes = {arch: {name: res.get("SHARED", 0) for name, res in usage.items() if "sm90a_probe_kernel" in name}
              for arch, usage in machine_code[1].items()}
    assert probes["sm_90a"], "no probe kernel in the sm_90a code"
    assert all(shared >= 16 for shared in probes["sm_90a"].values()), probes["sm_90a"]
    for arch, shared in probes.items():
        if arch != "sm_90a":
            assert not any(shared.values()), (arch, shared)
    for arch in cuda_build["build_info"]["cuda_archs"]:
        assert probes[arch].keys() == probes["sm_90a"].keys(), arch


def test_batch_norm_passes_move_16_bytes_and_round_each_step(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        kernels = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                   if "batch_norm" in name}
        # The sums, act and grad_input for three element types, each in 16-byte runs and one element at a
        # time, the loads-ahead sums and input gradient likewise, and the fused max pool's pass and gradient
        # (norm/max_pool_kernels.cuh); the finish and the finish by lines for each type.
        assert len(kernels) == 7 * 6 + 2 * 3, (arch, sorted(kernels))
        for name, ops in kernels.items():
            wide = "Li8E" in name or "Li4E" in name
            # The elementwise passes' outputs.
            stored = any(k in name for k in ("act_kernel", "grad_input", "act_max_pool", "max_pool_grad"))
            assert (sum(o.startswith("LDG.E.128") for o in ops) > 0) == wide, f"{arch} {name}: LDG.E.128"
            assert (sum(o.startswith("STG.E.128") for o in ops) > 0) == (wide and stored), f"{arch} {name}: STG"
            if wide and "Li8E" in name and "max_pool" in name:  # 8 window bytes a run, in one access
                window = "STG.E.64" if "act_max_pool" in name else "LDG.E.64"
                assert any(o.startswith(window) for o in ops), f"{arch} {name}: {window}"
            if "finish" not in name:
                assert sass.count_opcodes(ops, "FFMA") == 0, f"{arch} {name}: a step contracted into an FMA"
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


SASS_REGISTER = re.compile(r"\bR(\d+)\b")
# An instruction's first operand where it writes a general register (not a
# predicate, and not a store's address).
WRITTEN_REGISTER = re.compile(r"R(\d+)$")
STORES = ("STG", "STS", "ST", "STL", "RED", "ATOM", "ATOMG")


def row_loops(instructions):
    """The bodies of the loops (a branch back, and what lies between its
    target and it) that load from global memory."""
    loops = []
    for branch in instructions:
        target = branch.branch_target()
        if target is not None and target < branch.address:
            body = [i for i in instructions if target <= i.address <= branch.address]
            if any(i.opcode.startswith("LDG") for i in body):
                loops.append(body)
    return loops


def loads_before_first_use(body):
    """(the 16-byte global loads a loop body issues before any instruction
    reads a register that one of its loads wrote, whether every global load
    of the body comes before that read)."""
    loaded, wide_loads, first_use, last_load = set(), 0, None, None
    for n, i in enumerate(body):
        registers = [int(r) for r in SASS_REGISTER.findall(i.operands)]
        if i.opcode.startswith("LDG"):
            last_load = n
            wide_loads += first_use is None and i.opcode.startswith("LDG.E.128")
            width = 4 if ".128" in i.opcode else 2 if ".64" in i.opcode else 1
            loaded |= set(range(registers[0], registers[0] + width))
            continue
        written = WRITTEN_REGISTER.match(i.operands.split(",")[0].strip())
        if i.opcode.split(".")[0] in STORES:
            written = None
        if first_use is None and loaded & set(registers[1:] if written else registers):
            first_use = n
        if written:  # a register written here no longer holds a load's result (a .WIDE result: two)
            first = int(written.group(1))
            loaded -= set(range(first, first + (2 if ".WIDE" in i.opcode or ".64" in i.opcode else 1)))
    return wide_loads, first_use is None or last_load < first_use


def load_runs(instructions, load="LDS"):
    """How many loads of opcode `load` (by default 4-byte shared-memory
    loads) each run issues before an instruction reads a register one of
    them wrote, in the code's order."""
    runs, run, pending = [], 0, set()
    for i in instructions:
        registers = [int(r) for r in SASS_REGISTER.findall(i.operands)]
        if i.opcode == load:
            run += 1
            pending.add(registers[0])
            continue
        written = WRITTEN_REGISTER.match(i.operands.split(",")[0].strip())
        if i.opcode.split(".")[0] in STORES:
            written = None
        if pending & set(registers[1:] if written else registers):
            runs.append(run)
            run, pending = 0, set()
        elif written:
            pending.discard(int(written.group(1)))
    return runs


def test_batch_norm_loads_ahead_issue_four_rows_before_using_one(cuda_build, machine_code):
    # kRowsAhead (norm/batch_norm_ahead_kernels.cuh): each row loop of the 16-byte variants issues 4 rows' loads
    # (y forward; dz and y, and the bits or out, backward) before it reads any; the default kernels' loops wait
    # on each row's loads.
    code, _ = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        ahead = {name: instructions for name, instructions in code[arch].items()
                 if re.search(r"(sums|grad_input)_ahead_kernel.*Li[48]E", name)}
        assert len(ahead) == 2 * 3, (arch, sorted(ahead))
        for name, instructions in ahead.items():
            loops = [loads_before_first_use(body) for body in row_loops(instructions)]
            assert loops and all(before for _, before in loops), f"{arch} {name}: a load waited on in {loops}"
            # Forward, y's 4 rows; backward, dz's and y's.
            assert max(wide for wide, _ in loops) >= 8, f"{arch} {name}: {loops}"
            assert min(wide for wide, _ in loops) >= 4, f"{arch} {name}: {loops}"
        default = [name for name in code[arch] if "sums_kernelI6__halfLi8E" in name]
        assert not all(before for _, before in map(loads_before_first_use, row_loops(code[arch][default[0]])))


def test_batch_norm_line_finish_issues_every_load_before_its_first_add(cuda_build, machine_code):
    # norm/batch_norm_line_finish.cuh: before its butterfly a thread loads its lane's row blocks of both sums
    # (2 x kLineBlocksPerLane 4-byte loads), every one issued before an instruction reads what one brought;
    # then two xor steps for each of the two fp64 sums (two 32-bit shuffles a step).
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        finishes = {name: instructions for name, instructions in code[arch].items() if "line_finish_kernel" in name}
        assert len(finishes) == 3, (arch, sorted(finishes))
        for name, instructions in finishes.items():
            shuffles = [n for n, i in enumerate(instructions) if i.opcode.startswith("SHFL.BFLY")]
            assert len(shuffles) == 8, f"{arch} {name}: {len(shuffles)} shuffles"
            before = instructions[:shuffles[0]]
            loads = [i.opcode.removesuffix(".SYS") for i in before if i.opcode.startswith("LDG")]  # .SYS: sm_75's
            assert loads == ["LDG.E"] * 16, f"{arch} {name}: {loads}"
            _, issued_first = loads_before_first_use(before)
            assert issued_first, f"{arch} {name}: a partial's load waited on before the others were issued"
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


def test_gated_mlp_passes_move_16_bytes(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        kernels = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                   if "gated_kernel" in name}
        # Forward and backward for two element types and three activations.
        assert len(kernels) == 2 * 2 * 3, (arch, sorted(kernels))
        for name, ops in kernels.items():
            backward = "Lb1E" in name
            assert sum(o.startswith("LDG.E.128") for o in ops) >= (3 if backward else 2), f"{arch} {name}: loads"
            assert sum(o.startswith("STG.E.128") for o in ops) >= (3 if backward else 1), f"{arch} {name}: stores"
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


def test_layer_norm_passes_move_16_bytes_and_load_rows_ahead(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        kernels = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                   if "layer_norm_" in name}
        rows = {name: ops for name, ops in kernels.items() if "forward_kernel" in name or "grad_input_kernel" in name}
        sums = [ops for name, ops in kernels.items() if "weight_sums_kernel" in name]
        # Forward and dx: two element types, runs of 8 and of 1; the weights' sums per type; their total.
        assert len(rows) == 2 * 2 * 2 and len(sums) == 2 and len(kernels) == 11, (arch, sorted(kernels))
        for name, ops in rows.items():
            # A row's two sums, each a butterfly over the lanes, and no atomics.
            assert sum(o.startswith("SHFL.BFLY") for o in ops) == 10, f"{arch} {name}: shuffles"
            assert not any(o.startswith(("ATOM", "RED")) for o in ops), f"{arch} {name}: atomics"
            if "Li8EE" in name:  # x read in three steps (and dy in two of dx's), y or dx written, 16 bytes at a time
                assert sum(o.startswith("LDG.E.128") for o in ops) >= (4 if "grad_input" in name else 3), name
                assert sum(o.startswith("STG.E.128") for o in ops) >= 1, f"{arch} {name}: stores"
                assert not any(o.startswith("LDG.E.U16") for o in ops), f"{arch} {name}: 2-byte loads"
        for ops in sums:
            # Four rows' x and dy (and their mean and rstd) loaded before any of them is summed.
            first_sum = next(i for i, o in enumerate(ops) if o.startswith(("FADD", "FFMA")))
            assert sum(o.startswith("LDG.E.U16") for o in ops[:first_sum]) >= 8, arch
        for name in kernels:
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


def test_x_folded_in_chunks_stores_16_bytes_a_thread(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        folds = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                 if "fold_input" in name}
        chunks = [ops for name, ops in folds.items() if "fold_input_chunks_kernel" in name]
        elements = [ops for name, ops in folds.items() if "fold_input_kernel" in name]
        assert len(chunks) == len(elements) == 1, (arch, sorted(folds))
        ops = chunks[0]
        # A 16-byte store of 8 channels, each loaded on its own; its index split once: its code under twice the
        # element kernel's (which stores one element).
        assert sum(o.startswith("STG.E.128") for o in ops) == 1 and sum(o.startswith("STG") for o in ops) == 1, arch
        assert sum(o.startswith("LDG.E.U16") for o in ops) == 8, arch
        assert sum(o.startswith("STG.E.U16") for o in elements[0]) == 1, arch
        assert len(ops) < 2 * len(elements[0]), (arch, len(ops), len(elements[0]))
        for name in folds:
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


GATHERED_FOLD_KERNEL = "wgmma_gathered_fold_kernel"


def test_gathered_folds_are_the_conv_block_with_a_producer_that_stores(cuda_build, machine_code):
    """The kernels whose producer gathers x's fold itself
    (MPGEMM_GATHERED_FOLD=1): fprop on each of the three tiles and wgrad on
    those and the 64-row one, fp16 and bf16. The same Hopper block and
    epilogue, the filters (wgrad: dy) by the copy engine's tiled loads and no
    im2col load; x read by the producer's own 2-byte loads outside the
    mainloop, the next group of rows' issued before the last group's
    stores, which its threads store 4 bytes at a time, fence for the async
    proxy and announce on the stage's mbarrier; the producer keeps 88
    registers a thread and the consumers 208 (all of the block's 168 a
    thread: a consumer asking for more would wait forever); no spills."""
    if "sm_90a" not in cuda_build["build_info"]["cuda_archs"]:
        pytest.skip("the build has no sm_90a code")
    code, usage = machine_code
    kernels = {name: instructions for name, instructions in code["sm_90a"].items() if GATHERED_FOLD_KERNEL in name}
    assert len(kernels) == 14, sorted(kernels)
    assert sum("ConvPassE2E" in name for name in kernels) == 8, sorted(kernels)
    assert sum(M64_KERNEL in name for name in kernels) == 2, sorted(kernels)
    for name, instructions in kernels.items():
        check_hopper_block(name, instructions)
        opcodes = [i.opcode for i in instructions]
        assert sass.count_opcodes(opcodes, "UTMALDG.4D.IM2COL") == 0, f"{name} copies an im2col box"
        assert sass.count_opcodes(opcodes, "UTMALDG.3D") > 0, f"{name} lacks its tiled copies"
        registers = {i.opcode.split(".")[1]: i.operands for i in instructions if i.opcode.startswith("USETMAXREG")}
        assert "0x58" in registers.get("DEALLOC", "") and "0xd0" in registers.get("TRY_ALLOC", ""), registers
        # The producer's code, from its register release to its last exit: a group of rows' 4-byte stores
        # (fprop: 4 rows of one box; wgrad: 2 rows of each of the tile's boxes of 64 columns), two 2-byte
        # loads of x for each, once before the loop and once in it for the next group, and no other global
        # load; its stores fenced for the async proxy before it arrives on the stage's mbarrier.
        start = next(i.address for i in instructions if i.opcode.startswith("USETMAXREG.DEALLOC"))
        end = max(i.address for i in instructions if i.opcode == "EXIT")
        producer = [i for i in instructions if start <= i.address <= end]
        ops = [i.opcode for i in producer]
        # (ptxas lays the producer's code after the consumers': none of their wgmmas or strip stores there.)
        assert not any(op.startswith(("HGMMA", "UTMASTG", "STS.64")) for op in ops), f"{name}: code layout"
        stores = sum(op == "STS" for op in ops)
        assert stores == (4 if "ConvPassE0E" in name else 2 * tile_width(name) // 64), f"{name}: {stores} stores"
        assert sass.count_opcodes(ops, "LDG.E.U16") == sass.count_opcodes(ops, "LDG") == 4 * stores, name
        # Between the last shared store before each plain arrival and the arrival, a fence.
        arrivals = [k for k, i in enumerate(producer) if i.opcode.startswith("SYNCS.ARRIVE.TRANS64.A1T0")]
        assert arrivals, f"{name}: no arrival of the producer's threads"
        for k in arrivals:
            last_store = max((j for j in range(k) if producer[j].opcode == "STS"), default=-1)
            assert last_store >= 0 and any(i.opcode == "FENCE.VIEW.ASYNC.S" for i in producer[last_store:k]), \
                f"{name}: a gathered stage announced unfenced"
        res = usage["sm_90a"].get(name, {})
        assert res and res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{name}: {res}"


SLIDING_GATHER_KERNEL = re.compile(r"depthwise_sliding_gather_kernelI(\w+?)Li(\d)ELi(\d)ELin?1EEEv")


def test_depthwise_sliding_gather_loads_each_column_once_a_filter_row(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        kernels = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                   if SLIDING_GATHER_KERNEL.search(name)}
        # Two element types by filter rows of 3, 5 and 7 taps by fprop at column strides 1 and 2 and dgrad.
        assert len(kernels) == 2 * 3 * 3, (arch, sorted(kernels))
        for name, ops in kernels.items():
            taps, stride = (int(g) for g in SLIDING_GATHER_KERNEL.search(name).groups()[1:])
            # A filter row (the loop's body, not unrolled): its window's columns, 16 bytes each, then 4 pixels
            # by 8 channels of products a tap. The gather kernel loads 4 pixels a tap.
            window = 3 * stride + taps
            assert sass.count_opcodes(ops, "LDG.E.128") == window, f"{arch} {name}"
            assert sum(o == "FFMA" for o in ops) == 4 * 8 * taps, f"{arch} {name}"
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"


SLIDING_WGRAD_KERNEL = re.compile(r"depthwise_sliding_wgrad_kernelI(\w+?)Li(\d)ELi(\d)E")


def test_depthwise_sliding_wgrad_loads_each_column_once(cuda_build, machine_code):
    code, usage = machine_code
    for arch in cuda_build["build_info"]["cuda_archs"]:
        kernels = {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()
                   if SLIDING_WGRAD_KERNEL.search(name)}
        # Two element types by filter rows of 3, 5 and 7 taps by column strides 1 and 2.
        assert len(kernels) == 2 * 3 * 2, (arch, sorted(kernels))
        for name, ops in kernels.items():
            element, taps, stride = SLIDING_WGRAD_KERNEL.search(name).groups()
            taps, stride = int(taps), int(stride)
            loads = [o for o in ops if o.startswith("LD") and not o.startswith(("LDS", "LDC"))]
            # Each step's products: 4 channels a tap, `taps` steps unrolled (the compiler may peel a step or two).
            products = sum(o == "FFMA" for o in ops)
            assert products >= 4 * taps * taps and products % (4 * taps) == 0, f"{arch} {name}: {products} FFMA"
            steps = products // (4 * taps)
            # The first window's columns and dy, then for each step at most the next pixel's dy and `stride` new
            # columns, 8 bytes each: nothing loaded again for a tap.
            assert all(o.startswith("LDG.E.64") for o in loads), f"{arch} {name}: {collections.Counter(loads)}"
            assert taps + 1 + taps * (1 + stride) <= len(loads) <= taps + 1 + steps * (1 + stride), \
                f"{arch} {name}: {len(loads)} loads for {steps} steps"
            if element == "6__half":  # each loaded element converted once
                assert sum(o.startswith("HADD2.F32") for o in ops) == 4 * len(loads), f"{arch} {name}"
            res = usage[arch].get(name, {})
            assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{arch} {name}: {res}"
