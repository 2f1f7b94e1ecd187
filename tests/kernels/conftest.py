"""The two builds of the kernels a run makes, and their machine code: the
CUDA extension (setup.py) for sm_75 (the register-staged mainloop) and sm_90a
(the WMMA tiles on Hopper and the Hopper kernels), and the standalone CMake
library for sm_80 (the cp.async pipeline). The CUDA build check, the CMake
check and the SASS checks all read these, so that each kernel is compiled
once per arch per run.

It needs a Python whose torch is a CUDA build, named by MPGEMM_CUDA_PYTHON
(`make test` sets one up), and a CUDA compiler of torch's CUDA minor version:
CUDA_HOME if set, else the nvidia-cuda-nvcc wheel in that Python's
site-packages (site-packages/nvidia/cu13).
"""

import concurrent.futures
import glob
import json
import os
import shutil
import subprocess

import pytest

from mpgemm.tools import sass
from support import ROOT, skip_or_fail

# The extension's archs (MPGEMM_CUDA_BUILD_ARCHS overrides), and the CMake
# library's: together, every arch whose code differs.
BUILD_ARCHS = os.environ.get("MPGEMM_CUDA_BUILD_ARCHS", "7.5;9.0")
CMAKE_ARCH = "80"

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
    """(site-packages, torch.version.cuda) of `python`."""
    code = "import sysconfig, torch; print(sysconfig.get_paths()['purelib']); print(torch.version.cuda)"
    purelib, cuda = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return purelib, cuda


@pytest.fixture(scope="session")
def cuda_toolkit():
    """(the CUDA build's Python, its CUDA toolkit's root): a CUDA build of torch and an nvcc of its version."""
    python = os.environ.get("MPGEMM_CUDA_PYTHON")
    if not python:
        skip_or_fail("MPGEMM_CUDA_PYTHON is not set to a Python with a CUDA build of torch")
    purelib, torch_cuda = python_paths(python)
    if torch_cuda == "None":
        pytest.fail(f"{python} has a CPU build of torch; the CUDA build check needs a CUDA one")
    cuda_home = os.environ.get("CUDA_HOME") or os.path.join(purelib, "nvidia", "cu" + torch_cuda.split(".")[0])
    if not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        skip_or_fail(f"no nvcc under {cuda_home}")
    return python, cuda_home


def build_extension(work, python, cuda_home):
    """Builds the extension from a copy of the tree in `work` and imports it:
    its build info, whether each op has a CUDA kernel, the CPU reference's
    error, the module's path, the build log and the library."""
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "__pycache__",
                                                                 ".pytest_cache"))
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
        # The host units (g++ on torch's headers) without the debug info of
        # Python's default flags (-g), which costs a third of their compile
        # and which no check reads; g++'s code is the same either way.
        CFLAGS=(os.environ.get("CFLAGS", "") + " -g0").strip(),
    )
    env.pop("MPGEMM_FORCE_CPU", None)
    build = subprocess.run([python, "setup.py", "build_ext", "--inplace"], cwd=src, env=env, capture_output=True,
                           text=True)
    assert build.returncode == 0, f"CUDA build failed:\n{build.stdout[-6000:]}\n{build.stderr[-6000:]}"
    probe = subprocess.run([python, "-c", PROBE], cwd=src, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, f"importing the CUDA build failed:\n{probe.stderr[-6000:]}"
    library = next(str(p) for p in (src / "mpgemm").iterdir() if p.name.startswith("_C") and p.suffix == ".so")
    return dict(json.loads(probe.stdout.strip().splitlines()[-1]), src=str(src), log=build.stdout + build.stderr,
                library=library, requested_archs=BUILD_ARCHS)


def find_library(lib_dir, name):
    found = sorted(glob.glob(os.path.join(lib_dir, f"lib{name}.so*")))
    return found[0] if found else None


def cmake_libraries(toolkit):
    """(cudart, cublas) under `toolkit`, or (None, why the CMake build cannot run)."""
    if shutil.which("cmake") is None:
        return None, "cmake not found"
    cudart, cublas = (find_library(os.path.join(toolkit, "lib"), name) for name in ("cudart", "cublas"))
    if not (os.path.exists(os.path.join(toolkit, "include", "cublas_v2.h")) and cudart and cublas):
        return None, f"no CUDA toolkit with cuBLAS under {toolkit}"
    return cudart, cublas


def build_cmake_library(build, toolkit, cudart, cublas):
    """Configures and builds CMakeLists.txt for CMAKE_ARCH in `build`."""
    # CMake looks for unversioned library names; the wheels ship only versioned ones.
    configure = [
        "cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_CUDA_ARCHITECTURES={CMAKE_ARCH}",
        f"-DCMAKE_CUDA_COMPILER={os.path.join(toolkit, 'bin', 'nvcc')}",
        f"-DCUDA_CUDART={cudart}", f"-DCUDA_cudart_LIBRARY={cudart}", f"-DCUDA_cublas_LIBRARY={cublas}",
    ]
    for cmd in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return str(build)


@pytest.fixture(scope="session")
def builds(request, tmp_path_factory, cuda_toolkit):
    """The builds this run's tests read, started together in the background
    when the first is asked for: {"cuda": future, "cmake": future}. Each
    leaves a core idle for a while (the extension's longest unit, CMake's
    configure step), which the other then fills."""
    python, cuda_home = cuda_toolkit
    used = {name for item in request.session.items for name in item.fixturenames}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = {}
        if "cuda_build" in used:
            jobs["cuda"] = pool.submit(build_extension, tmp_path_factory.mktemp("cuda_build"), python, cuda_home)
        cudart, cublas = cmake_libraries(cuda_home)
        if "cmake_build" in used and cudart is not None:
            jobs["cmake"] = pool.submit(build_cmake_library, tmp_path_factory.mktemp("cmake_build"), cuda_home, cudart,
                                        cublas)
        yield jobs


@pytest.fixture(scope="session")
def cuda_build(builds):
    """build_extension's result."""
    return builds["cuda"].result()


@pytest.fixture(scope="session")
def cmake_build(builds, cuda_toolkit):
    """The CMake build folder (CMAKE_ARCH)."""
    cudart, why = cmake_libraries(cuda_toolkit[1])
    if cudart is None:
        skip_or_fail(why)
    return builds["cmake"].result()


@pytest.fixture(scope="session")
def machine_code(cuda_build, cmake_build):
    """Both builds' kernels, read back with cuobjdump: {arch: {kernel name:
    [sass.Instruction]}} and {arch: {kernel name: resource usage}} (REG,
    STACK, SHARED, LOCAL, ...), for sm_75 and sm_90a from the extension and
    sm_80 from the CMake library."""
    if sass.find_tool("cuobjdump") is None or sass.find_tool("nvdisasm") is None:
        skip_or_fail("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    library, cmake_library = cuda_build["library"], os.path.join(cmake_build, "libmpgemm_kernels.a")
    archs = [(library, arch) for arch in cuda_build["build_info"]["cuda_archs"]] + [(cmake_library, f"sm_{CMAKE_ARCH}")]
    code, usage = {}, {}
    # One cuobjdump per arch, on every core: the Hopper kernels alone are over a million lines.
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for dump in pool.map(lambda job: sass.dump_sass_instructions(*job), archs):
            for (arch, name), instructions in dump.items():
                code.setdefault(arch, {})[name] = instructions
    for binary in (library, cmake_library):
        for (arch, name), resources in sass.resource_usage(binary).items():
            usage.setdefault(arch, {})[name] = resources
    return code, usage
