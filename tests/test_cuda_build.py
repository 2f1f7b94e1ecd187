"""CUDA build check: the full CUDA extension (CPU reference plus WMMA kernels)
compiles, links and imports on a machine without a GPU, and every op has a
CUDA kernel registered. The Hopper GEMM's sm_90a code in the built library
is read back: wgmma (HGMMA) in its mainloop and no mma.sync, the copy engine
(UTMALDG), mbarriers (SYNCS) and register reallocation, an epilogue that
writes shared memory with shared stores (STS), fences it for the copy engine
and stores it with the copy engine (UTMASTG) for two output types only (fp32
and the inputs' own), no spills, and no ptxas
advisory that it serialized the wgmmas or ignored setmaxnreg; the
kernels for pairs of blocks multicast their copies, arrive on the other
block's mbarriers and meet at a cluster barrier, with no memory fence in the
mainloop.

It needs a Python whose torch is a CUDA build, named by MPGEMM_CUDA_PYTHON
(`make test` sets one up), and a CUDA compiler of torch's CUDA minor version:
CUDA_HOME if set, else the nvidia-cuda-nvcc wheel in that Python's
site-packages (site-packages/nvidia/cu13).
"""

import json
import os
import shutil
import subprocess

import pytest

from conftest import skip_or_fail
from mpgemm.tools import sass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A pre-Ampere and a Hopper target keep both mainloops (register-staged and
# cp.async) in the build while keeping it short; MPGEMM_CUDA_BUILD_ARCHS overrides.
BUILD_ARCHS = os.environ.get("MPGEMM_CUDA_BUILD_ARCHS", "7.5;9.0")

PROBE = """
import json, torch, mpgemm
ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("mpgemm::"))
a, b = torch.randn(9, 20).half(), torch.randn(20, 7).half()
err = (mpgemm.gemm(a, b) - a.double() @ b.double()).abs().max().item()
print(json.dumps({
    "build_info": mpgemm.build_info(),
    "ops": {op: torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA") for op in ops},
    "cpu_error": err,
    "module": mpgemm.__file__,
}))
"""


def python_paths(python):
    code = "import sysconfig, torch; print(sysconfig.get_paths()['purelib']); print(torch.version.cuda)"
    purelib, cuda = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return purelib, cuda


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    python = os.environ.get("MPGEMM_CUDA_PYTHON")
    if not python:
        skip_or_fail("MPGEMM_CUDA_PYTHON is not set to a Python with a CUDA build of torch")
    purelib, torch_cuda = python_paths(python)
    if torch_cuda == "None":
        pytest.fail(f"{python} has a CPU build of torch; the CUDA build check needs a CUDA one")
    cuda_home = os.environ.get("CUDA_HOME") or os.path.join(purelib, "nvidia", "cu" + torch_cuda.split(".")[0])
    if not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        skip_or_fail(f"no nvcc under {cuda_home}")

    work = tmp_path_factory.mktemp("cuda_build")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "__pycache__"))
    # The wheels ship only libcudart.so.<major>; the linker looks for libcudart.so.
    libs = work / "lib"
    libs.mkdir()
    for lib in os.listdir(os.path.join(cuda_home, "lib")):
        if lib.startswith("libcudart.so."):
            os.symlink(os.path.join(cuda_home, "lib", lib), libs / "libcudart.so")
            break
    env = dict(
        os.environ,
        CUDA_HOME=cuda_home,
        PATH=os.path.join(cuda_home, "bin") + os.pathsep + os.environ["PATH"],
        LIBRARY_PATH=str(libs) + os.pathsep + os.environ.get("LIBRARY_PATH", ""),
        TORCH_CUDA_ARCH_LIST=BUILD_ARCHS,
        MAX_JOBS=str(os.cpu_count() or 2),
    )
    env.pop("MPGEMM_FORCE_CPU", None)
    build = subprocess.run([python, "setup.py", "build_ext", "--inplace"], cwd=src, env=env, capture_output=True,
                           text=True)
    assert build.returncode == 0, f"CUDA build failed:\n{build.stdout[-6000:]}\n{build.stderr[-6000:]}"
    probe = subprocess.run([python, "-c", PROBE], cwd=src, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, f"importing the CUDA build failed:\n{probe.stderr[-6000:]}"
    library = next(str(p) for p in (src / "mpgemm").iterdir() if p.name.startswith("_C") and p.suffix == ".so")
    return dict(json.loads(probe.stdout.strip().splitlines()[-1]), src=str(src), log=build.stdout + build.stderr,
                library=library)


def test_imports_the_cuda_build(cuda_build):
    assert cuda_build["module"].startswith(cuda_build["src"])
    info = cuda_build["build_info"]
    assert info["backend"] == "cuda"
    # 9.0 is built as sm_90a, whose code alone has the Hopper GEMM (setup.py).
    expected = sorted("sm_" + arch.replace(".", "") + ("a" if arch == "9.0" else "") for arch in BUILD_ARCHS.split(";"))
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
def hopper_kernels(cuda_build):
    """{kernel name: [sass.Instruction]} of the Hopper GEMM kernels in the built library's sm_90a code."""
    if "sm_90a" not in cuda_build["build_info"]["cuda_archs"]:
        pytest.skip("the build has no sm_90a code")
    if sass.find_tool("cuobjdump") is None or sass.find_tool("nvdisasm") is None:
        skip_or_fail("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    code = sass.dump_sass_instructions(cuda_build["library"])
    kernels = {name: instructions for (arch, name), instructions in code.items()
               if arch == "sm_90a" and "wgmma_gemm_kernel" in name}
    # Two input types by four operand layouts by three kernels: blocks alone,
    # pairs, pairs with ping-pong consumers.
    assert len(kernels) == 24, sorted(kernels)
    assert sum(PAIR_KERNEL in name for name in kernels) == 16, sorted(kernels)
    assert sum(PING_PONG_KERNEL in name for name in kernels) == 8, sorted(kernels)
    return kernels


# The mangled kCluster = 2 (after the input type) of the kernels for pairs of
# blocks, and the consumer schedule after it (sm90::Consumers::kPingPong = 1).
PAIR_KERNEL = "Li2ELNS1_9Consumers"
PING_PONG_KERNEL = "ConsumersE1E"


def test_hopper_mainloop_runs_wgmma_on_copies_the_copy_engine_made(hopper_kernels):
    for name, instructions in hopper_kernels.items():
        opcodes = [i.opcode for i in instructions]
        hgmma = "HGMMA.64x256x16.F32.BF16" if "__nv_bfloat16" in name else "HGMMA.64x256x16.F32"
        assert {op for op in opcodes if op.startswith("HGMMA")} == {hgmma}, name
        assert sass.count_opcodes(opcodes, "HMMA") == 0, f"{name} runs mma.sync"
        mix = sass.mainloop_mix(instructions)
        # One K slice: four k16 steps, no global loads (the copy engine's) and no block barrier.
        assert mix is not None and mix.counts["hmma"] == 4, f"{name}: {mix}"
        assert mix.counts["global"] == 0 and mix.counts["barrier"] == 0, f"{name}: {mix.counts}"
        for needed in ("UTMALDG", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "SYNCS.ARRIVE.TRANS64", "USETMAXREG.DEALLOC",
                       "USETMAXREG.TRY_ALLOC", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR",
                       # The epilogue through the copy engine.
                       "STS.64", "FENCE.VIEW.ASYNC.S", "UTMASTG.3D", "BAR.SYNC.DEFER_BLOCKING"):
            assert sass.count_opcodes(opcodes, needed) > 0, f"{name} lacks {needed}"
        # Its strips are written through the shared window, not generic
        # addresses; each is fenced for the copy engine and met on twice
        # (before it is written, and before it is stored).
        assert sass.count_opcodes(opcodes, "ST.E") == 0, f"{name} writes its output strips with generic stores"
        stores = sass.count_opcodes(opcodes, "UTMASTG.3D")
        # The epilogues of two output types, fp32 (8 strips a tile) and the
        # inputs' own (4), for each of 3 activations: a third type would
        # nearly double the kernels' compile time (bench/NOTES.md).
        assert stores == 3 * (8 + 4), f"{name}: {stores} strip stores"
        assert sass.count_opcodes(opcodes, "FENCE.VIEW.ASYNC.S") >= stores, f"{name}: a strip stored unfenced"
        assert sass.count_opcodes(opcodes, "BAR.SYNC.DEFER_BLOCKING") >= 2 * stores, f"{name}: strip barriers"
        # Pairs: B's copies multicast, stages handed back to the other block
        # (a remote arrival), and a cluster barrier before the first of either.
        pair_only = ("UTMALDG.3D.MULTICAST", "SYNCS.ARRIVE.TRANS64.RED", "UCGABAR_ARV", "UCGABAR_WAIT")
        for op in pair_only:
            assert (sass.count_opcodes(opcodes, op) > 0) == (PAIR_KERNEL in name), f"{name}: {op}"
        # Ping-pong: each consumer's turn to run its mainloop, handed on
        # with bar.arrive, met with bar.sync.
        assert (sass.count_opcodes(opcodes, "BAR.ARV") > 0) == (PING_PONG_KERNEL in name), f"{name}: BAR.ARV"
        body = [i.opcode for i in instructions if mix.start <= i.address <= mix.end]
        assert not [op for op in body if op.startswith("MEMBAR")], f"{name} fences memory in its mainloop"


def test_hopper_kernels_neither_spill_nor_serialize(cuda_build, hopper_kernels):
    usage = sass.resource_usage(cuda_build["library"])
    for name in hopper_kernels:
        res = usage.get(("sm_90a", name)) or usage.get((None, name)) or {}
        assert res and res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, f"{name}: {res}"
    # ptxas reports wgmmas it had to serialize, waits it injected and a
    # setmaxnreg it ignored as performance advisories (codes C75xx).
    advisories = [line for line in cuda_build["log"].splitlines()
                  if "Potential Performance Loss" in line or "is injected" in line or "(C75" in line]
    assert not advisories, "\n".join(advisories[:10])
