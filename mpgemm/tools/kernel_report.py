"""`python -m mpgemm inspect`: the proof that Tensor Cores do the work.

Lists every kernel compiled into the extension with its arch, the type of its
products' inputs (fp16 or bf16), registers, shared, stack and local memory,
its count of HMMA (and HGMMA) Tensor Core instructions, and the instruction
mix of its mainloop, read from the machine code with cuobjdump. On a GPU it
also runs each op once under torch.profiler and shows which kernels ran.
"""

import dataclasses
import re
import shutil
import subprocess

import torch

from .. import _C
from . import sass
from .._build import build_info
from ..plan import tile_configs
from . import display


# The kernels that must run on Tensor Cores, by name: GEMM, convolution (the
# WMMA implicit GEMMs and the Hopper one) and the mma.sync ceiling.
TENSOR_CORE_KERNELS = ("gemm_kernel", "conv2d_kernel", "wgmma_conv_kernel", "mma_ceiling_kernel")
# The Hopper kernels: wgmma and setmaxnreg, in sm_90a code alone.
HOPPER_KERNELS = ("wgmma_gemm_kernel", "wgmma_splitk_gemm_kernel", "wgmma_stream_k_gemm_kernel",
                  "wgmma_pre_activation_gemm_kernel", "wgmma_pre_activation_gelu_tanh_gemm_kernel",
                  "row_sums_gemm_kernel", "wgmma_activation_grad_gemm_kernel", "wgmma_conv_kernel")
# The mainloop mix's columns, by sass.mix_category: one pass through the
# innermost loop that holds HMMA. "other" is what keeps the Tensor Cores
# waiting: address arithmetic, predicates and loop control.
MIX_COLUMNS = {"hmma": "loop HMMA", "ldsm": "LDSM", "global": "LDG", "barrier": "BAR", "shared": "LDS/STS",
               "other": "other"}
# The oldest arch whose Tensor Cores take bf16. For older archs the bf16
# kernels are compiled to an empty body, and their launchers refuse to run.
BF16_MIN_ARCH = 80


_SOURCE_NAME = re.compile(r"L?(\d+)")  # a mangled name's <length><identifier>, the length matched


def function_name(name):
    """A kernel's own name, from its mangled name: the last source name of
    its nested name (`_ZN6mpgemm7kernels16wmma_gemm_kernelI...`:
    "wmma_gemm_kernel"), or the one source name after `_Z`; any other name
    (a demangled one) as it is. Matching the kinds above against it, not the
    whole mangled name, keeps out a kernel of an anonymous namespace, whose
    mangled name holds its unit's file name
    (`_GLOBAL__N__..._gemm_kernels_pair_fp16_cu_...`); a demangled name reads
    "(anonymous namespace)" there."""
    nested = name.startswith("_ZN")
    if not (nested or name.startswith("_Z")):
        return name
    position, own = 3 if nested else 2, None
    while match := _SOURCE_NAME.match(name, position):  # L: an internal name
        start = match.end()
        own, position = name[start:start + int(match.group(1))], start + int(match.group(1))
        if not nested:
            break
    return own or name


def is_tensor_core_kernel(name):
    """Whether the kernel named `name` is one of TENSOR_CORE_KERNELS."""
    own = function_name(name)
    return any(kind in own for kind in TENSOR_CORE_KERNELS)


def input_element(name):
    """The type of a kernel's Tensor Core inputs, from its (mangled or
    demangled) name: "bf16", "fp16", or "" for a kernel templated on neither."""
    if "__nv_bfloat16" in name:
        return "bf16"
    return "fp16" if "__half" in name else ""


def arch_number(arch):
    """75 for "sm_75" (90 for "sm_90a"), 0 if unknown."""
    digits = "".join(c for c in arch.removeprefix("sm_") if c.isdigit())
    return int(digits) if digits else 0


def tile_min_arch(name):
    """The min_arch (10 * major + minor) of the tile a GEMM or convolution
    kernel is instantiated on, from its mangled or demangled name and the tile
    types of mpgemm.tile_configs(); 0 for other kernels."""
    for config in tile_configs():
        tile = config["type"]
        if f"{len(tile)}{tile}E" in name or re.search(rf"::{tile}\b", name):
            return config["min_arch"]
    return 0


def compiled_out(arch, name):
    """Whether a Tensor Core kernel is built empty for `arch` by design: bf16
    below sm_80, GEMM and convolution tiles below their min_arch (kTileCompiled), and the
    Hopper kernels everywhere but sm_90a (wgmma and setmaxnreg exist there alone)."""
    return ((input_element(name) == "bf16" and arch_number(arch) < BF16_MIN_ARCH)
            or tile_min_arch(name) > arch_number(arch)
            or (any(kernel in name for kernel in HOPPER_KERNELS) and arch != "sm_90a"))


@dataclasses.dataclass
class KernelInfo:
    arch: str
    name: str
    input: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    local_bytes: int
    hmma: int
    hgmma: int
    mix: object = None  # sass.MainloopMix, None where no loop holds HMMA


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return list(names)
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def inspect_binary(path):
    """KernelInfo for every kernel of every arch in a cubin, object or shared library."""
    usage = sass.resource_usage(path)
    code = sass.dump_sass_instructions(path)
    kernels = []
    for (arch, name), instructions in sorted(code.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        res = usage.get((arch, name)) or usage.get((None, name)) or {}
        opcodes = [i.opcode for i in instructions]
        kernels.append(KernelInfo(arch or "?", name, input_element(name), res.get("REG", 0), res.get("SHARED", 0), res.get("STACK", 0),
                                  res.get("LOCAL", 0), sass.count_opcodes(opcodes, "HMMA"),
                                  sass.count_opcodes(opcodes, "HGMMA"), sass.mainloop_mix(instructions)))
    for kernel, readable in zip(kernels, demangle([k.name for k in kernels])):
        kernel.name = readable
    return kernels


def mix_cells(mix):
    """The mix columns of one kernel: counts, then other per HMMA; "-" without a mainloop."""
    if mix is None:
        return ("-",) * (len(MIX_COLUMNS) + 1)
    return (*(mix.counts[category] for category in MIX_COLUMNS), f"{mix.other_per_hmma:.2f}")


def format_kernels(kernels):
    header = ("arch", "input", "regs", "shared", "stack", "local", "HMMA", "HGMMA", *MIX_COLUMNS.values(),
              "other/HMMA", "kernel")
    rows = [(k.arch, k.input or "-", k.registers, k.shared_bytes, k.stack_bytes, k.local_bytes, k.hmma, k.hgmma,
             *mix_cells(k.mix), k.name) for k in kernels]
    return display.format_table(header, rows)


def mix_legend():
    """What the mix columns count, from sass.MIX_CATEGORIES."""
    counted = [f"{MIX_COLUMNS[category]} counts {'+'.join(opcodes)}"
               for category, opcodes in sass.MIX_CATEGORIES.items() if MIX_COLUMNS[category] != "/".join(opcodes)]
    return display.wrap(f"{MIX_COLUMNS['hmma']} to other/HMMA: one pass through the mainloop (the innermost loop "
                        f"holding HMMA) as compiled; {', '.join(counted)}; other is address arithmetic, predicates "
                        "and loop control; '-': no such loop.")


def profile_ops():
    """Runs each op once on the GPU under torch.profiler: {op: [CUDA kernels that ran]}."""
    from .. import ops

    a = torch.randn(512, 512, device="cuda").half()
    b = torch.randn(512, 512, device="cuda").half()
    x = torch.randn(8, 64, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    weight = torch.randn(64, 64, 3, 3, device="cuda")
    calls = {
        "mpgemm.gemm": lambda: ops.gemm(a, b, bias=torch.randn(512, device="cuda"), activation="gelu"),
        "mpgemm.linear": lambda: ops.linear(a, b, activation="relu"),
        "mpgemm.conv2d": lambda: ops.conv2d(x.half(), weight.half(), padding=1),
        "mpgemm.unscale_grads_": lambda: torch.ops.mpgemm.unscale_grads_(
            [a], [torch.empty(a.shape, device="cuda")], torch.zeros(1, device="cuda"),
            torch.ones(1, device="cuda")),
    }
    if torch.cuda.get_device_capability() >= (BF16_MIN_ARCH // 10, BF16_MIN_ARCH % 10):
        calls["mpgemm.gemm (bf16)"] = lambda: ops.gemm(a.bfloat16(), b.bfloat16())
        calls["mpgemm.conv2d (bf16)"] = lambda: ops.conv2d(x.bfloat16(), weight.bfloat16(), padding=1)
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
    if any(k.mix for k in kernels):
        print(mix_legend())
    products = [k for k in kernels if is_tensor_core_kernel(k.name)]
    empty = [k for k in products if compiled_out(k.arch, k.name)]
    products = [k for k in products if not compiled_out(k.arch, k.name)]
    without = [k for k in products if k.hmma + k.hgmma == 0]
    print(f"\n{len(products) - len(without)} of {len(products)} GEMM, convolution and mma.sync ceiling kernels "
          "contain Tensor Core instructions")
    if empty:
        print(f"({len(empty)} bf16 kernels for {', '.join(sorted({k.arch for k in empty}))} are built empty: "
              f"bf16 Tensor Cores need sm_{BF16_MIN_ARCH}; their launchers refuse to run them)")
    if args.binary is None and info["cuda_available"]:
        print("\nkernels that ran, per op (torch.profiler):")
        for op, names in profile_ops().items():
            print(f"  {op}: {', '.join(demangle(names)) or '(none)'}")
    return 1 if without or not products else 0
