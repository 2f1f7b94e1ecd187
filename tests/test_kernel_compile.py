"""Kernel compile check: nvcc builds csrc/kernels for every Tensor Core arch we
support; ptxas reports no spills and no stack frame, and the SASS of every GEMM
and convolution kernel holds the Tensor Core HMMA instructions of its input
type (fp16 or bf16), except the bf16 ones below sm_80, which must hold none.
No GPU needed."""

import concurrent.futures
import glob
import os
import subprocess

import pytest

from conftest import skip_or_fail
from mpgemm.tools import sass
from mpgemm.tools.kernel_report import TENSOR_CORE_KERNELS, input_element

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "kernels", "*.cu")))
# The HMMA each arch's WMMA m16n16k16 with fp32 accumulation compiles to, per
# input type (opcodes as cuobjdump spells them). None: no Tensor Core code, as
# bf16 WMMA needs sm_80 and its kernels are compiled out below.
EXPECTED_HMMA = {
    "sm_75": {"fp16": "HMMA.1688.F32", "bf16": None},
    "sm_80": {"fp16": "HMMA.16816.F32", "bf16": "HMMA.16816.F32.BF16"},
    "sm_90": {"fp16": "HMMA.16816.F32", "bf16": "HMMA.16816.F32.BF16"},
}
# The GEMM and convolution kernels: every one is built for both input types.
PRODUCT_KERNELS = ("gemm_kernel", "conv2d_kernel")


def compile_source(nvcc, source, arch, out_dir):
    """Compiles one kernel source for `arch`: (ptxas's kernels, {kernel name: SASS opcodes})."""
    cubin = os.path.join(out_dir, f"{os.path.basename(source)}.{arch}.cubin")
    cmd = [nvcc, "-std=c++17", "-O3", "-cubin", f"-arch={arch}", "-Xptxas", "-v", source, "-o", cubin]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed for {source} on {arch}:\n{proc.stderr}"
    return sass.parse_ptxas_report(proc.stderr), {name: ops for (_, name), ops in sass.dump_sass(cubin).items()}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{arch: (ptxas's kernels, {kernel name: SASS opcodes})} over every source."""
    nvcc = sass.find_tool("nvcc")
    if nvcc is None:
        skip_or_fail("nvcc not found")
    if sass.find_tool("cuobjdump") is None or sass.find_tool("nvdisasm") is None:
        skip_or_fail("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    out_dir = str(tmp_path_factory.mktemp("kernels"))
    # One job per source and arch, the largest sources first, so that the cores stay busy to the end.
    jobs = [(source, arch) for source in sorted(KERNEL_SOURCES, key=os.path.getsize, reverse=True)
            for arch in EXPECTED_HMMA]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = [(arch, pool.submit(compile_source, nvcc, source, arch, out_dir)) for source, arch in jobs]
        results = {arch: ([], {}) for arch in EXPECTED_HMMA}
        for arch, future in futures:
            kernels, functions = future.result()
            results[arch][0].extend(kernels)
            results[arch][1].update(functions)
        return results


@pytest.mark.parametrize("arch", sorted(EXPECTED_HMMA))
def test_no_spills_and_no_stack(compiled, arch):
    kernels = compiled[arch][0]
    assert kernels, "ptxas reported no kernels"
    bad = [k for k in kernels if k.stack_bytes or k.spill_store_bytes or k.spill_load_bytes]
    assert not bad, "\n".join(f"{k.name}: {k}" for k in bad)


def hmma_counts(opcodes):
    """{exact HMMA opcode: count}: HMMA.16816.F32 is a prefix of the bf16 form."""
    counts = {}
    for op in opcodes:
        if op.startswith("HMMA"):
            counts[op] = counts.get(op, 0) + 1
    return counts


@pytest.mark.parametrize("arch", sorted(EXPECTED_HMMA))
def test_every_gemm_and_conv_kernel_uses_tensor_cores_of_its_type(compiled, arch):
    reported = {k.name for k in compiled[arch][0]}
    functions = compiled[arch][1]
    assert set(functions) == reported, "SASS and ptxas disagree on the kernels"
    mma_kernels = {name: ops for name, ops in functions.items() if any(k in name for k in TENSOR_CORE_KERNELS)}
    assert {k for k in TENSOR_CORE_KERNELS if any(k in name for name in mma_kernels)} == set(TENSOR_CORE_KERNELS)
    built = {(k, input_element(name)) for name in mma_kernels for k in PRODUCT_KERNELS if k in name}
    assert built == {(k, t) for k in PRODUCT_KERNELS for t in ("fp16", "bf16")}, "a kernel lacks an input type"
    for name, opcodes in mma_kernels.items():
        expected, found = EXPECTED_HMMA[arch][input_element(name)], hmma_counts(opcodes)
        if expected is None:
            assert not found, f"{name} is built for {arch}, which has no bf16 Tensor Cores: {found}"
        else:
            assert set(found) == {expected}, f"{name}: expected only {expected}, found {found}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_aligned_kernels_copy_16_bytes_asynchronously(compiled, arch):
    # Kernels instantiated for 16-byte chunks (Vector = 8, their last template
    # argument: "Li8EEEv" in the mangled name), fp16 and bf16 alike, must stage
    # tiles with 16-byte cp.async (LDGSTS.128).
    aligned = {name: ops for name, ops in compiled[arch][1].items()
               if any(k in name for k in PRODUCT_KERNELS) and "Li8EEEv" in name}
    assert {input_element(name) for name in aligned} == {"fp16", "bf16"}
    for name, opcodes in aligned.items():
        assert sass.count_opcodes(opcodes, "LDGSTS.E.BYPASS.128") > 0, name


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fragments_load_from_shared_memory_with_ldmatrix(compiled, arch):
    # WMMA's bf16 loads become generic LD.E unless the shared state space is
    # spelled out (csrc/kernels/wmma_load.cuh); fp16's become LDSM by themselves.
    for name, opcodes in compiled[arch][1].items():
        if any(k in name for k in PRODUCT_KERNELS):
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


def test_ptxas_parser_reads_known_report():
    report = """ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'
ptxas info    : Function properties for _Z1kv
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 8 bytes cumulative stack size"""
    (k,) = sass.parse_ptxas_report(report)
    assert (k.name, k.arch, k.registers, k.stack_bytes, k.spill_store_bytes, k.spill_load_bytes) == (
        "_Z1kv", "sm_90", 96, 8, 4, 12)


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
