"""Reading compiled kernels: resource usage and SASS from cuobjdump.

This is how mpgemm proves that its kernels run on the Tensor Cores (HMMA
instructions in the machine code) without spilling registers.
"""

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sysconfig

_SASS_ARCH = re.compile(r"code for (sm_\d+a?)")
_SASS_FUNCTION = re.compile(r"Function : (\S+)")
_SASS_INSTRUCTION = re.compile(
    r"/\*(?P<address>[0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(?P<opcode>[A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(?P<operands>[^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")


@dataclasses.dataclass
class Instruction:
    """One SASS instruction: its byte address, opcode with modifiers (e.g.
    "HMMA.16816.F32") and operand text."""

    address: int
    opcode: str
    operands: str = ""

    def branch_target(self):
        """The address a branch (BRA) jumps to, or None for anything else."""
        if self.opcode.split(".")[0] != "BRA":
            return None
        m = _BRANCH_TARGET.search(self.operands)
        return int(m.group(1), 16) if m else None


def parse_sass_instructions(text):
    """{(arch, kernel name): [Instruction, ...]} from `cuobjdump --dump-sass` output."""
    functions = {}
    arch = None
    instructions = None
    for line in text.splitlines():
        if m := _SASS_ARCH.search(line):
            arch = m.group(1)
        elif m := _SASS_FUNCTION.search(line):
            instructions = functions.setdefault((arch, m.group(1)), [])
        elif instructions is not None and (m := _SASS_INSTRUCTION.search(line)):
            instructions.append(Instruction(int(m["address"], 16), m["opcode"], m["operands"].strip()))
    return functions


def parse_sass(text):
    """{(arch, kernel name): [opcode, ...]} from `cuobjdump --dump-sass` output.
    Opcodes keep their modifiers, e.g. "HMMA.16816.F32"."""
    return {key: [i.opcode for i in code] for key, code in parse_sass_instructions(text).items()}


# How the mainloop's instructions are counted: the work (Tensor Core
# products, fragment loads from shared memory, global loads, barriers and
# cp.async waits, other shared-memory traffic), and everything else, which is
# address arithmetic, predicates and loop control.
MIX_CATEGORIES = {
    "hmma": ("HMMA", "HGMMA"),
    "ldsm": ("LDSM",),
    "global": ("LDG", "LDGSTS"),
    "barrier": ("BAR", "DEPBAR", "LDGDEPBAR"),
    "shared": ("LDS", "STS"),
}


def mix_category(opcode):
    base = opcode.split(".")[0]
    for category, bases in MIX_CATEGORIES.items():
        if base in bases:
            return category
    return "other"


@dataclasses.dataclass
class MainloopMix:
    """The instruction mix of one pass through a kernel's mainloop: the
    innermost loop (a backward branch and its target) that holds Tensor Core
    instructions. Static counts, as the code reads."""

    start: int
    end: int
    counts: dict
    # Block-wide barriers (BAR.SYNC) in the pass: mpgemm's mainloops meet at
    # one per K slice, and a pass may be unrolled over several slices.
    block_barriers: int = 1

    @property
    def instructions(self):
        return sum(self.counts.values())

    @property
    def hmma(self):
        return self.counts.get("hmma", 0)

    @property
    def other(self):
        return self.counts.get("other", 0)

    @property
    def other_per_hmma(self):
        return self.other / self.hmma if self.hmma else float("inf")

    @property
    def hmma_per_slice(self):
        """HMMA per K slice: per block-wide barrier of the pass."""
        return self.hmma / max(self.block_barriers, 1)


def mainloop_mix(instructions):
    """MainloopMix of the innermost loop holding HMMA (or HGMMA) instructions;
    the one with most of them where loops of equal depth tie; None if no loop
    holds any."""
    loops = []
    for index, instruction in enumerate(instructions):
        target = instruction.branch_target()
        if target is None or target > instruction.address:
            continue
        body = [i for i in instructions[:index + 1] if i.address >= target]
        if any(mix_category(i.opcode) == "hmma" for i in body):
            loops.append((target, instruction.address, body))
    # Innermost: no other such loop lies inside it.
    innermost = [loop for loop in loops
                 if not any(other is not loop and loop[0] <= other[0] and other[1] <= loop[1] for other in loops)]
    if not innermost:
        return None
    start, end, body = max(innermost, key=lambda loop: sum(mix_category(i.opcode) == "hmma" for i in loop[2]))
    counts = {category: 0 for category in (*MIX_CATEGORIES, "other")}
    for i in body:
        counts[mix_category(i.opcode)] += 1
    barriers = sum(1 for i in body if i.opcode.split(".")[0] == "BAR" and ".SYNC" in i.opcode)
    return MainloopMix(start, end, counts, barriers)


def find_tool(name):
    """Path of a CUDA binary tool: on PATH, under CUDA_HOME, or from the
    nvidia-cuda-* PyPI packages (site-packages/nvidia/cu*/bin). None if absent."""
    found = shutil.which(name)
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    roots += glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*"))
    for root in roots:
        candidate = os.path.join(root, "bin", name)
        if root and os.access(candidate, os.X_OK):
            return candidate
    return None


def dump_sass_instructions(binary, arch=None):
    """SASS of every kernel in a cubin, object file or library (of one arch,
    e.g. "sm_90a", if given): {(arch, kernel name): [Instruction, ...]}."""
    return parse_sass_instructions(_run_cuobjdump("--dump-sass", binary, arch))


_RESOURCE_ARCH = re.compile(r"arch = (sm_\d+a?)")
_RESOURCE_FUNCTION = re.compile(r"Function (\S+):")
_RESOURCE_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_resource_usage(text):
    """{(arch, kernel name): {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n, ...}}
    from `cuobjdump --dump-resource-usage` output (arch is None for a bare cubin)."""
    usage = {}
    arch = None
    function = None
    for line in text.splitlines():
        if m := _RESOURCE_ARCH.search(line):
            arch = m.group(1)
        elif m := _RESOURCE_FUNCTION.search(line):
            function = m.group(1)
        elif function and "REG:" in line:
            usage[(arch, function)] = {k: int(v) for k, v in _RESOURCE_FIELD.findall(line)}
            function = None
    return usage


def _run_cuobjdump(flag, binary, arch=None):
    cuobjdump = find_tool("cuobjdump")
    nvdisasm = find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        raise FileNotFoundError(
            "cuobjdump and nvdisasm are needed to read SASS: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
        )
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    arch_args = ["-arch", arch] if arch else []
    return subprocess.run([cuobjdump, flag, *arch_args, binary], capture_output=True, text=True, env=env,
                          check=True).stdout


def resource_usage(binary):
    """Registers, stack, shared and local memory of every kernel in a binary."""
    return parse_resource_usage(_run_cuobjdump("--dump-resource-usage", binary))


def count_opcodes(opcodes, prefix):
    """How many instructions start with `prefix` (e.g. "HMMA", "HMMA.16816.F32")."""
    return sum(1 for op in opcodes if op == prefix or op.startswith(prefix + "."))
