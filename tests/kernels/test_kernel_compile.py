"""SASS checks: the machine code of every kernel, as a run's two builds hold
it (conftest.py's machine_code: sm_75 and sm_90a from the CUDA extension,
sm_80 from the CMake library, each kernel compiled once per arch), has no
spills and no stack frame, and the SASS of every WMMA GEMM and convolution
kernel holds the Tensor Core HMMA instructions of its input type (fp16 or
bf16), except the bf16 ones below sm_80, which must hold none (the Hopper
kernels' wgmma is test_cuda_build.py's). The mainloops of the sm_90 kernels
that stage 16-byte chunks must meet issue 15's bound on instructions besides
HMMA. No GPU needed."""

import re

import pytest

from mpgemm.tools import sass
from mpgemm.tools.kernel_report import (HOPPER_KERNELS, TENSOR_CORE_KERNELS, compiled_out, demangle, input_element,
                                        is_tensor_core_kernel)

# The HMMA each arch's WMMA m16n16k16 with fp32 accumulation compiles to, per
# input type (opcodes as cuobjdump spells them). None: no Tensor Core code, as
# bf16 WMMA needs sm_80 and its kernels are compiled out below.
EXPECTED_HMMA = {
    "sm_75": {"fp16": "HMMA.1688.F32", "bf16": None},
    "sm_80": {"fp16": "HMMA.16816.F32", "bf16": "HMMA.16816.F32.BF16"},
    "sm_90a": {"fp16": "HMMA.16816.F32", "bf16": "HMMA.16816.F32.BF16"},
}
# The WMMA GEMM and convolution kernels: every one is built for both input
# types. (The Hopper kernels, HOPPER_KERNELS, run no mma.sync.)
PRODUCT_KERNELS = ("wmma_gemm_kernel", "conv2d_kernel")
# Kernels instantiated for 16-byte chunks: Vector = 8, their last template
# argument, as it ends the mangled name.
ALIGNED_VECTOR = "Li8EEEv"
# Issue 15's targets for the mainloop on sm_90: at most this many other
# instructions (address arithmetic, predicates, loop control) per HMMA in the
# aligned kernels, fp16 and bf16. A mainloop of LARGE_TILE_HMMA or more HMMA
# per K slice (per block barrier: a pass may be unrolled over several slices)
# shares its overhead among more products, hence the tighter bound.
MIX_ARCH = "sm_90a"
LARGE_TILE_HMMA = 64
OTHER_PER_HMMA_LIMITS = {  # kernel: (bound from LARGE_TILE_HMMA HMMA per slice, bound below)
    "wmma_gemm_kernel": (0.75, 1.5),
    "conv2d_kernel": (1.5, 3.0),  # fprop, dgrad and wgrad alike
}
# Kernels instantiated for 8- and 4-byte chunks (Vector = 4 or 2: odd
# leading dimensions of a GEMM; convolutions with channels per group a
# multiple of 4, or padded to one), by the end of their mangled names: the
# cp.async they must stage tiles with on sm_80+, and bounds on their
# mainloops' other instructions per HMMA on MIX_ARCH as in
# OTHER_PER_HMMA_LIMITS. Each chunk costs a pointer step and a predicate, and
# they move 2x and 4x the chunks of the aligned kernels: these bounds guard
# what they reach (bench/NOTES.md), not issue 15's 1.5. Convolutions take
# 8-byte chunks alone, on the compact and small tiles (and the 128 x 16
# one, whose bounds are its own, below).
NARROW_VECTORS = {"Li4EEEv": "LDGSTS.E.64", "Li2EEEv": "LDGSTS.E"}
NARROW_OTHER_PER_HMMA_LIMITS = {("wmma_gemm_kernel", "Li4EEEv"): (2.5, 3.5), ("wmma_gemm_kernel", "Li2EEEv"): (3.5, 7.0),
                                ("conv2d_kernel", "Li4EEEv"): (4.5, 4.5)}
# The convolution's 128 x 16 tile (N16Tile: fprop and dgrad of at most 16
# columns a group), by a part of its kernels' mangled names. A warp's 32 x
# 16 tile is 2 x 1 fragments over 4 k16 steps a slice: 16 HMMA.16816 a
# slice, a quarter of the small tile's, so that its mainloop is its
# gathers, bounded by instructions per copied chunk rather than by issue
# 15's bounds per HMMA (which it is left out of). A thread copies 8 chunks
# of A's 128 x 64 patch and 1 of B's 16 x 64 filters a slice at 16 bytes,
# twice as many at 8.
N16_KERNEL = "7N16Tile"
N16_HMMA_PER_SLICE = 16
N16_COPIES_PER_SLICE = {ALIGNED_VECTOR: 9, "Li4EEEv": 18}
N16_OTHER_PER_COPY = 14.0


@pytest.fixture(scope="module")
def compiled(machine_code):
    """{arch: ({kernel name: resource usage}, {kernel name: SASS opcodes}, {kernel name: SASS Instructions})}
    for every arch of EXPECTED_HMMA."""
    code, usage = machine_code
    missing = sorted(set(EXPECTED_HMMA) - set(code))
    assert not missing, f"the CUDA build holds no {missing} code"
    return {arch: (usage[arch], {name: [i.opcode for i in instructions] for name, instructions in code[arch].items()},
                   code[arch])
            for arch in EXPECTED_HMMA}


def aligned_kernels(functions, kernels=PRODUCT_KERNELS, vector=ALIGNED_VECTOR):
    """The entries of {kernel name: ...} for `kernels` instantiated for 16-byte chunks (or `vector`)."""
    return {name: value for name, value in functions.items()
            if any(k in name for k in kernels) and vector in name}


@pytest.mark.parametrize("arch", sorted(EXPECTED_HMMA))
def test_no_spills_and_no_stack(compiled, arch):
    # A spilled register lives in local memory, beside any stack frame.
    usage = compiled[arch][0]
    assert usage, "cuobjdump reported no kernels"
    bad = {name: res for name, res in usage.items() if res.get("STACK", 0) or res.get("LOCAL", 0)}
    assert not bad, "\n".join(f"{name}: {res}" for name, res in bad.items())


def hmma_counts(opcodes):
    """{exact HMMA opcode: count}: HMMA.16816.F32 is a prefix of the bf16 form."""
    counts = {}
    for op in opcodes:
        if op.startswith("HMMA"):
            counts[op] = counts.get(op, 0) + 1
    return counts


@pytest.mark.parametrize("arch", sorted(EXPECTED_HMMA))
def test_every_gemm_and_conv_kernel_uses_tensor_cores_of_its_type(compiled, arch):
    functions = compiled[arch][1]
    assert set(functions) == set(compiled[arch][0]), "SASS and the resource usage disagree on the kernels"
    mma_kernels = {name: ops for name, ops in functions.items() if is_tensor_core_kernel(name)}
    assert {k for k in TENSOR_CORE_KERNELS if any(k in name for name in mma_kernels)} == set(TENSOR_CORE_KERNELS)
    built = {(k, input_element(name)) for name in mma_kernels for k in PRODUCT_KERNELS if k in name}
    assert built == {(k, t) for k in PRODUCT_KERNELS for t in ("fp16", "bf16")}, "a kernel lacks an input type"
    for name, opcodes in mma_kernels.items():
        expected, found = EXPECTED_HMMA[arch][input_element(name)], hmma_counts(opcodes)
        if compiled_out(arch, name):  # bf16 below sm_80, a tile for newer archs, Hopper kernels outside sm_90a
            assert not found, f"{name} is built for {arch}, which it is not meant for: {found}"
        elif any(kernel in name for kernel in HOPPER_KERNELS):
            assert not found and sass.count_opcodes(opcodes, "HGMMA") > 0, f"{name}: {found}"
        else:
            assert set(found) == {expected}, f"{name}: expected only {expected}, found {found}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_aligned_kernels_copy_16_bytes_asynchronously(compiled, arch):
    # The aligned kernels, fp16 and bf16 alike, must stage tiles with 16-byte
    # cp.async (LDGSTS.128).
    aligned = aligned_kernels(compiled[arch][1])
    assert {input_element(name) for name in aligned} == {"fp16", "bf16"}
    for name, opcodes in aligned.items():
        assert sass.count_opcodes(opcodes, "LDGSTS.E.BYPASS.128") > 0, name


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kernel,vector", sorted(NARROW_OTHER_PER_HMMA_LIMITS))
def test_narrow_kernels_copy_their_chunks_asynchronously(compiled, arch, kernel, vector):
    narrow = aligned_kernels(compiled[arch][1], (kernel,), vector)
    assert {input_element(name) for name in narrow} == {"fp16", "bf16"}
    for name, opcodes in narrow.items():
        copies = {op for op in opcodes if op.split(".")[0] == "LDGSTS"}
        assert copies == {NARROW_VECTORS[vector]}, f"{name}: {sorted(copies)}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fragments_load_from_shared_memory_with_ldmatrix(compiled, arch):
    # WMMA's bf16 loads become generic LD.E unless the shared state space is
    # spelled out (csrc/kernels/arch/wmma_load.cuh); fp16's become LDSM by themselves.
    for name, opcodes in compiled[arch][1].items():
        if any(k in name for k in PRODUCT_KERNELS) and not compiled_out(arch, name):
            generic = [op for op in opcodes if op.split(".")[0] == "LD"]
            assert sass.count_opcodes(opcodes, "LDSM") > 0 and not generic, f"{name}: {sorted(set(generic))}"


def test_sass_parser_reads_known_listing():
    listing = """
	code for sm_80
		Function : kernel_a
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;   /* 0x00000a00ff017624 */
                                                                              /* 0x000fe400078e00ff */
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;          /* 0x0000000c0804723c */
        /*0020*/               @P0 HMMA.16816.F32 R4, R8, R12, R4 ;          /* 0x0000000c0804723c */
		Function : kernel_b
        /*0000*/                   EXIT ;                                    /* 0x000000000000794d */
"""
    functions = sass.parse_sass(listing)
    assert functions == {
        ("sm_80", "kernel_a"): ["IMAD.MOV.U32", "HMMA.16816.F32", "HMMA.16816.F32"],
        ("sm_80", "kernel_b"): ["EXIT"],
    }
    assert sass.count_opcodes(functions[("sm_80", "kernel_a")], "HMMA") == 2


def listed_instructions(listing):
    """The Instructions of the one function in a hand-written cuobjdump listing."""
    (instructions,) = sass.parse_sass_instructions(listing).values()
    return instructions


def test_mainloop_mix_counts_one_pass_through_the_loop_holding_hmma():
    instructions = listed_instructions("""
	code for sm_90
		Function : one_loop
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   LDGDEPBAR ;
        /*0030*/                   DEPBAR.LE SB0, 0x1 ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/                   LDSM.16.M88.4 R8, [R3] ;
        /*0060*/                   LDS.128 R16, [R3+0x100] ;
        /*0070*/                   HMMA.16816.F32.BF16 R12, R8, R10, R12 ;
        /*0080*/                   HMMA.16816.F32.BF16 R20, R8, R18, R20 ;
        /*0090*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00a0*/                   ISETP.GE.AND P0, PT, R0, c[0x0][0x160], PT ;
        /*00b0*/              @!P0 BRA 0x10 ;
        /*00c0*/                   STG.E [R6.64], R12 ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA 0xe0;
""")
    mix = sass.mainloop_mix(instructions)
    assert (mix.start, mix.end) == (0x10, 0xb0)
    assert mix.counts == {"hmma": 2, "ldsm": 1, "global": 1, "barrier": 3, "shared": 1, "other": 3}
    assert (mix.instructions, mix.hmma, mix.other, mix.other_per_hmma) == (11, 2, 3, 1.5)


def test_sass_parser_keeps_the_shape_of_warpgroup_mma():
    # wgmma's shape modifier is spelled in lower case: 64x256x16.
    (instruction,) = listed_instructions("""
	code for sm_90a
		Function : hopper
        /*1440*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR16], R24, gsb0 ;
""")
    assert (instruction.address, instruction.opcode) == (0x1440, "HGMMA.64x256x16.F32.BF16")
    assert sass.mix_category(instruction.opcode) == "hmma"


def test_mainloop_mix_takes_the_inner_loop_and_ignores_forward_branches():
    # The outer loop (0x10 to 0xf0) holds more HMMA, but the inner one (0x60
    # to 0xa0) is the mainloop; the forward branch at 0x40 is no loop.
    instructions = listed_instructions("""
	code for sm_90
		Function : nested_loops
        /*0000*/                   MOV R0, RZ ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   STS.128 [R1], R4 ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0040*/               @P1 BRA 0x60 ;
        /*0050*/                   IADD3 R9, R9, 0x1, RZ ;
        /*0060*/                   LDSM.16.MT88.4 R8, [R3] ;
        /*0070*/                   HMMA.16816.F32 R12, R8, R10, R12 ;
        /*0080*/                   IADD3 R3, R3, 0x20, RZ ;
        /*0090*/                   ISETP.NE.AND P0, PT, R3, R5, PT ;
        /*00a0*/               @P0 BRA 0x60 ;
        /*00b0*/                   HMMA.16816.F32 R20, R8, R10, R20 ;
        /*00c0*/                   HMMA.16816.F32 R24, R8, R10, R24 ;
        /*00d0*/                   IADD3 R2, P2, R2, 0x40, RZ ;
        /*00e0*/                   ISETP.GE.AND P0, PT, R2, R7, PT ;
        /*00f0*/              @!P0 BRA P2, 0x10 ;
        /*0100*/                   EXIT ;
        /*0110*/                   BRA 0x110 ;
""")
    mix = sass.mainloop_mix(instructions)
    assert (mix.start, mix.end) == (0x60, 0xa0)
    assert mix.counts == {"hmma": 1, "ldsm": 1, "global": 0, "barrier": 0, "shared": 0, "other": 3}
    assert mix.other_per_hmma == 3.0


def test_mainloop_mix_of_side_by_side_loops_takes_the_one_with_most_hmma():
    # An unrolled loop and its remainder, as nvcc splits a loop of unknown trip count.
    instructions = listed_instructions("""
	code for sm_80
		Function : unrolled_and_remainder
        /*0000*/                   HMMA.16816.F32 R12, R8, R10, R12 ;
        /*0010*/                   HMMA.16816.F32 R12, R8, R10, R12 ;
        /*0020*/                   ISETP.GT.AND P0, PT, R0, 0x1, PT ;
        /*0030*/               @P0 BRA 0x0 ;
        /*0040*/                   HMMA.16816.F32 R12, R8, R10, R12 ;
        /*0050*/               @P1 BRA 0x40 ;
        /*0060*/                   EXIT ;
""")
    mix = sass.mainloop_mix(instructions)
    assert (mix.start, mix.end, mix.hmma, mix.other) == (0x0, 0x30, 2, 2)


def test_mainloop_mix_is_none_without_a_loop_holding_hmma():
    # HMMA after a forward branch, and a loop of other work: no mainloop.
    instructions = listed_instructions("""
	code for sm_90
		Function : no_mainloop
        /*0000*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0010*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0020*/              @!P0 BRA 0x0 ;
        /*0030*/               @P1 BRA 0x50 ;
        /*0040*/                   HMMA.16816.F32 R12, R8, R10, R12 ;
        /*0050*/                   EXIT ;
        /*0060*/                   BRA 0x60 ;
""")
    assert sass.mainloop_mix(instructions) is None
    assert sass.mainloop_mix([]) is None


def test_branch_targets_and_mix_categories_of_real_opcodes():
    assert sass.Instruction(0x190, "BRA", "P2, 0x5e0").branch_target() == 0x5e0
    assert sass.Instruction(0x190, "BRA.U", "!UP0, 0x40").branch_target() == 0x40
    assert sass.Instruction(0x30, "DEPBAR.LE", "SB0, 0x1").branch_target() is None
    expected = {
        "LDGSTS.E.BYPASS.128": "global", "LDG.E.128": "global", "LDSM.16.M88.4": "ldsm", "LDSM.16.MT88.4": "ldsm",
        "DEPBAR.LE": "barrier", "BAR.SYNC.DEFER_BLOCKING": "barrier", "LDGDEPBAR": "barrier",
        "HMMA.16816.F32.BF16": "hmma", "HMMA.1688.F32": "hmma", "HGMMA.64x128x16.F32": "hmma",
        "LDS.128": "shared", "STS.128": "shared", "IMAD.WIDE": "other", "LDL": "other", "BRA": "other",
    }
    assert {opcode: sass.mix_category(opcode) for opcode in expected} == expected


@pytest.mark.parametrize("arch", sorted(EXPECTED_HMMA))
def test_mma_ceiling_issues_hmma_from_registers_alone(compiled, arch):
    # Between its first and last HMMA the ceiling kernel may only loop: no
    # memory access and no barrier, or it would measure something else.
    (opcodes,) = [ops for name, ops in compiled[arch][1].items() if "mma_ceiling_kernel" in name]
    hmma = [i for i, op in enumerate(opcodes) if op.startswith("HMMA")]
    assert len(hmma) >= 16, f"only {len(hmma)} HMMA"  # one round: 4x2 fragments of 2 (sm_80+) or 4 HMMA each
    between = opcodes[hmma[0]:hmma[-1] + 1]
    memory = [op for op in between if op.split(".")[0] in ("LD", "LDS", "LDSM", "LDG", "LDGSTS", "ST", "STS", "STG",
                                                           "BAR", "ATOM", "RED")]
    assert not memory, f"memory or barrier instructions among the HMMA: {sorted(set(memory))}"
    assert sass.count_opcodes(between, "HMMA") > len(between) // 2, "the loop is mostly not HMMA"


def aligned_mainloops(compiled, kernel, vector=ALIGNED_VECTOR, arch=MIX_ARCH, n16=False):
    """{kernel name: MainloopMix or None} of the aligned (or `vector`) `kernel`s compiled for `arch`: the
    128 x 16 tile's alone where `n16`, every other tile's otherwise."""
    return {name: sass.mainloop_mix(code)
            for name, code in aligned_kernels(compiled[arch][2], (kernel,), vector).items()
            if not compiled_out(arch, name) and (N16_KERNEL in name) == n16}


def other_per_hmma_limit(limits, mix):
    large_tile, smaller = limits
    return large_tile if mix.hmma_per_slice >= LARGE_TILE_HMMA else smaller


def mainloops_over_limits(mixes, limits):
    """Lines naming each kernel of {name: MainloopMix or None} above its bound in limits."""
    offending = {name: mix for name, mix in mixes.items()
                 if mix is None or mix.other_per_hmma > other_per_hmma_limit(limits, mix)}
    lines = []
    for readable, mix in zip(demangle(list(offending)), offending.values()):
        if mix is None:
            lines.append(f"{readable}: no loop holds HMMA")
        else:
            counts = " ".join(f"{category}={n}" for category, n in mix.counts.items())
            lines.append(f"{readable}: {mix.other_per_hmma:.2f} other per HMMA > "
                         f"{other_per_hmma_limit(limits, mix)} ({counts})")
    return lines


@pytest.mark.parametrize("kernel", sorted(OTHER_PER_HMMA_LIMITS))
def test_aligned_mainloops_spend_few_instructions_besides_hmma(compiled, kernel):
    mixes = aligned_mainloops(compiled, kernel)
    assert {input_element(name) for name in mixes} == {"fp16", "bf16"}
    lines = mainloops_over_limits(mixes, OTHER_PER_HMMA_LIMITS[kernel])
    assert not lines, (f"{len(lines)} of {len(mixes)} aligned {kernel}s on {MIX_ARCH} miss issue 15's "
                       "bound on other instructions per HMMA in the mainloop:\n" + "\n".join(lines))


@pytest.mark.parametrize("kernel,vector", sorted(NARROW_OTHER_PER_HMMA_LIMITS))
def test_narrow_mainloops_stay_within_their_bounds(compiled, kernel, vector):
    mixes = aligned_mainloops(compiled, kernel, vector)
    assert {input_element(name) for name in mixes} == {"fp16", "bf16"}
    lines = mainloops_over_limits(mixes, NARROW_OTHER_PER_HMMA_LIMITS[(kernel, vector)])
    assert not lines, (f"{len(lines)} of {len(mixes)} narrow {kernel}s ({vector}) on {MIX_ARCH} exceed their "
                       "bound on other instructions per HMMA in the mainloop:\n" + "\n".join(lines))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("vector", sorted(N16_COPIES_PER_SLICE))
def test_n16_tile_mainloops_copy_their_chunks_and_multiply_them(compiled, arch, vector):
    mixes = {**aligned_mainloops(compiled, "conv2d_kernel", vector, arch, n16=True),
             **aligned_mainloops(compiled, "conv2d_fprop_moments_kernel", vector, arch, n16=True)}
    # fprop and dgrad (and fprop with its moments at 16 bytes), fp16 and bf16.
    assert len(mixes) == (6 if vector == ALIGNED_VECTOR else 4), sorted(mixes)
    for name, mix in mixes.items():
        assert mix is not None, f"{name}: no loop holds HMMA"
        copies_per_slice = mix.counts["global"] * N16_HMMA_PER_SLICE / mix.hmma
        assert (mix.hmma_per_slice, copies_per_slice) == (N16_HMMA_PER_SLICE, N16_COPIES_PER_SLICE[vector]), (
            f"{name}: {mix.hmma_per_slice} HMMA and {copies_per_slice} copies a slice")
        assert mix.other / mix.counts["global"] <= N16_OTHER_PER_COPY, (
            f"{name}: {mix.other / mix.counts['global']:.1f} other instructions per copied chunk ({mix.counts})")


# Kernels that must have large-tile mainloops, by a part of their (mangled)
# names: the GEMM, and the convolution's fprop, dgrad and wgrad (ConvPass 0, 1, 2).
LARGE_TILE_KERNELS = {"gemm": "wmma_gemm_kernel", "conv fprop": "ConvPassE0ELi8", "conv dgrad": "ConvPassE1ELi8",
                      "conv wgrad": "ConvPassE2ELi8"}


@pytest.mark.parametrize("kernel", sorted(LARGE_TILE_KERNELS))
def test_large_tile_mainloops_exist(compiled, kernel):
    part = LARGE_TILE_KERNELS[kernel]
    mixes = aligned_mainloops(compiled, "wmma_gemm_kernel") | aligned_mainloops(compiled, "conv2d_kernel")
    most = max((mix.hmma_per_slice for name, mix in mixes.items() if mix and part in name), default=0)
    assert most >= LARGE_TILE_HMMA, (f"the aligned {kernel} kernels on {MIX_ARCH} issue at most {most} HMMA per K "
                                     f"slice of the mainloop; issue 15's large tiles issue {LARGE_TILE_HMMA} or more")


def test_large_tile_mainloops_load_the_next_fragments_among_the_mma(compiled):
    # The k16 steps of a slice are unrolled, so ptxas can issue the next
    # step's ldmatrix while this step's mma_sync run; a loop that loads every
    # fragment before its first HMMA would leave the Tensor Cores waiting.
    for name, code in aligned_kernels(compiled[MIX_ARCH][2]).items():
        mix = sass.mainloop_mix(code)
        if compiled_out(MIX_ARCH, name) or mix is None or mix.hmma_per_slice < LARGE_TILE_HMMA:
            continue
        body = [i.opcode.split(".")[0] for i in code if mix.start <= i.address <= mix.end]
        first_hmma = body.index("HMMA")
        between = body[first_hmma:len(body) - body[::-1].index("HMMA")]
        assert between.count("LDSM") >= mix.counts["ldsm"] // 2, f"{name}: {between.count('LDSM')} of {mix.counts['ldsm']} LDSM among the HMMA"


def _registers(operand, count):
    """The `count` registers from the one `operand` names (R12 -> 12 ... 12 + count - 1); none for RZ or others."""
    m = re.match(r"R(\d+)", operand.strip())
    return set(range(int(m.group(1)), int(m.group(1)) + count)) if m else set()


def hmma_ready_at_barriers(code, mix):
    """For each block barrier of the mainloop: the HMMA between it and the next
    copies (the loop wraps around) whose A and B registers no ldmatrix past
    the barrier writes: products on fragments loaded before it."""
    body = [i for i in code if mix.start <= i.address <= mix.end]
    counts = []
    for at, barrier in enumerate(body):
        if not barrier.opcode.startswith("BAR.SYNC"):
            continue
        loaded, ready = set(), 0
        for i in body[at + 1:] + body[:at]:
            if i.opcode.startswith("LDGSTS"):
                break
            operands = i.operands.split(",")
            if i.opcode.startswith("LDSM"):  # LDSM.16.M88.4 writes 4 registers, .2 two, else one
                width = i.opcode.rsplit(".", 1)[-1]
                loaded |= _registers(operands[0], int(width) if width.isdigit() else 1)
            elif i.opcode.startswith("HMMA"):  # HMMA.16816: D, A (4 registers), B (2), C
                ready += not (_registers(operands[1], 4) | _registers(operands[2], 2)) & loaded
        counts.append(ready)
    return counts


def test_block_barriers_leave_the_tensor_cores_work(compiled):
    # The block meets once per K slice, after its second-to-last k16 step:
    # the last step's fragments are already in registers, so its mma_sync
    # issue as soon as the barrier lets warps go, while the next slice's
    # first fragments load. A barrier at the top of a slice, before its
    # loads, leaves every warp with no HMMA to issue until its first ldmatrix
    # returns: 0 ready products. At least a sixteenth of a slice's HMMA must
    # be ready after each barrier (a k16 step is a quarter or a half).
    checked = 0
    for name, code in aligned_kernels(compiled[MIX_ARCH][2]).items():
        mix = sass.mainloop_mix(code)
        if compiled_out(MIX_ARCH, name) or mix is None:
            continue
        counts = hmma_ready_at_barriers(code, mix)
        assert counts, f"{name}: no block barrier in the mainloop"
        assert min(counts) >= mix.hmma_per_slice // 16, (
            f"{name}: {min(counts)} HMMA on fragments loaded before a block barrier, of {mix.hmma_per_slice:.0f} "
            "per slice")
        checked += 1
    assert checked > 0


def test_ready_hmma_count_follows_the_registers():
    I = sass.Instruction
    loop = [I(0x00, "HMMA.16816.F32", "R40, R4, R8, R40"),
            I(0x10, "BAR.SYNC.DEFER_BLOCKING", "0x0"),
            I(0x20, "LDSM.16.M88.4", "R4, [R100]"),           # the next A fragment: R4 .. R7
            I(0x30, "HMMA.16816.F32", "R44, R12.reuse, R8, R44"),  # fragments from before the barrier
            I(0x40, "HMMA.16816.F32", "R48, R6, R8, R48"),     # A in R6: loaded past the barrier
            I(0x50, "LDGSTS.E.BYPASS.128", "[R1], desc[UR4][R2.64]"),
            I(0x60, "HMMA.16816.F32", "R52, R12, R10, R52"),   # after the copies: not counted
            I(0x70, "BRA", "0x0")]
    mix = sass.mainloop_mix(loop)
    assert hmma_ready_at_barriers(loop, mix) == [1]
