"""`python -m mpgemm inspect`: the proof that Tensor Cores do the work.

Lists every kernel compiled into the extension with its arch, registers,
shared, stack and local memory, and its count of HMMA (and HGMMA) Tensor Core
instructions, read from the machine code with cuobjdump. On a GPU it also runs
each op once under torch.profiler and shows which kernels ran.
"""

import dataclasses
import shutil
import subprocess

import torch

from .. import _C
from . import sass
from .._build import build_info
from . import display


# The kernels that must run on Tensor Cores, by name: GEMM, convolution and
# the mma.sync ceiling.
TENSOR_CORE_KERNELS = ("gemm_kernel", "conv2d_kernel", "mma_ceiling_kernel")


@dataclasses.dataclass
class KernelInfo:
    arch: str
    name: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    local_bytes: int
    hmma: int
    hgmma: int


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return list(names)
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def inspect_binary(path):
    """KernelInfo for every kernel of every arch in a cubin, object or shared library."""
    usage = sass.resource_usage(path)
    code = sass.dump_sass(path)
    kernels = []
    for (arch, name), opcodes in sorted(code.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        res = usage.get((arch, name)) or usage.get((None, name)) or {}
        kernels.append(KernelInfo(arch or "?", name, res.get("REG", 0), res.get("SHARED", 0), res.get("STACK", 0),
                                  res.get("LOCAL", 0), sass.count_opcodes(opcodes, "HMMA"),
                                  sass.count_opcodes(opcodes, "HGMMA")))
    for kernel, readable in zip(kernels, demangle([k.name for k in kernels])):
        kernel.name = readable
    return kernels


def format_kernels(kernels):
    header = ("arch", "regs", "shared", "stack", "local", "HMMA", "HGMMA", "kernel")
    rows = [(k.arch, k.registers, k.shared_bytes, k.stack_bytes, k.local_bytes, k.hmma, k.hgmma, k.name)
            for k in kernels]
    return display.format_table(header, rows)


def profile_ops():
    """Runs each op once on the GPU under torch.profiler: {op: [CUDA kernels that ran]}."""
    from .. import ops

    a = torch.randn(512, 512, device="cuda").half()
    b = torch.randn(512, 512, device="cuda").half()
    calls = {
        "mpgemm.gemm": lambda: ops.gemm(a, b, bias=torch.randn(512, device="cuda"), activation="gelu"),
        "mpgemm.linear": lambda: ops.linear(a, b, activation="relu"),
        "mpgemm.conv2d": lambda: ops.conv2d(
            torch.randn(8, 64, 28, 28, device="cuda").half().to(memory_format=torch.channels_last),
            torch.randn(64, 64, 3, 3, device="cuda").half(), padding=1),
        "mpgemm.unscale_grads_": lambda: torch.ops.mpgemm.unscale_grads_(
            [a], [torch.empty(a.shape, device="cuda")], torch.zeros(1, device="cuda"),
            torch.ones(1, device="cuda")),
    }
    ran = {}
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        ran[name] = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return ran


def main(args):
    info = build_info()
    if args.binary is None and info["backend"] != "cuda":
        print("mpgemm inspect: this is a CPU-only build of mpgemm; it holds no CUDA kernels to inspect. "
              "Build with a CUDA torch and nvcc (see README).")
        return 1
    binary = args.binary or _C.__file__
    try:
        kernels = inspect_binary(binary)
    except (FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"mpgemm inspect: cannot read the machine code of {binary}: {e}")
        return 1
    print(f"{binary}: {len(kernels)} kernels for {', '.join(sorted({k.arch for k in kernels}))}")
    print(format_kernels(kernels))
    products = [k for k in kernels if any(name in k.name for name in TENSOR_CORE_KERNELS)]
    without = [k for k in products if k.hmma + k.hgmma == 0]
    print(f"\n{len(products) - len(without)} of {len(products)} GEMM, convolution and mma.sync ceiling kernels "
          "contain Tensor Core instructions")
    if args.binary is None and info["cuda_available"]:
        print("\nkernels that ran, per op (torch.profiler):")
        for op, names in profile_ops().items():
            print(f"  {op}: {', '.join(demangle(names)) or '(none)'}")
    return 1 if without or not products else 0
