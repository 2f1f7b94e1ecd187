"""Where a measurement comes from: device, driver, versions, commit and date.

Every number the tools print or save carries this. The tree is copied to a
GPU machine without `.git`, so `make gpu-bundle` runs this file beforehand
to write the commit into `COMMIT` at the repository root, and the commit is
read from there wherever git cannot tell it. The module imports nothing at
load time beyond the standard library, so bench/gpu_check.py can load it
before the extension is built, and `python3 mpgemm/tools/provenance.py`
prints the commit.
"""

import datetime
import os
import subprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_commit(root=REPO_ROOT):
    """The commit of the tree at `root`: git's HEAD when the tracked files
    match it; else the COMMIT file that `make gpu-bundle` writes before a tree
    is copied to a GPU machine (where a .git, if any, is not this tree's);
    else HEAD with "-dirty"; else "unknown"."""
    head = dirty = None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    if head and not dirty:
        return head
    try:
        with open(os.path.join(root, "COMMIT")) as f:
            bundled = f.read().strip()
    except OSError:
        bundled = ""
    return bundled or (head + "-dirty" if head else "unknown")


# The environment variables that choose kernels (csrc/kernels/plan/gemm_plan.h,
# conv/launch.h, the epilogues' switches of csrc/autograd.cpp and
# mpgemm.fusion, batch norm's loads ahead and finish, the loss scaler's
# kernel, fused chains' outputs kept): a measurement names those that were
# set.
KERNEL_PATH_VARIABLES = ("MPGEMM_GEMM_PATH", "MPGEMM_CONV_PATH", "MPGEMM_NARROW_TILES", "MPGEMM_STAGED_ROW_STORES",
                         "MPGEMM_DGRAD_ONE_LAUNCH", "MPGEMM_CHUNKED_FOLD", "MPGEMM_PADDED_OPERANDS",
                         "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_STREAM_K", "MPGEMM_EPILOGUE_PRE_ACTIVATION",
                         "MPGEMM_EPILOGUE_BIAS_GRAD", "MPGEMM_EPILOGUE_ACTIVATION_GRAD", "MPGEMM_EPILOGUE_STATS", "MPGEMM_GATED_KERNEL",
                         "MPGEMM_BATCH_NORM_LOADS_AHEAD", "MPGEMM_BATCH_NORM_FINISH_BY_LINES",
                         "MPGEMM_LOSS_SCALE_KERNEL", "MPGEMM_M64_TILE",
                         "MPGEMM_GATHERED_FOLD", "MPGEMM_RECOMPUTE_CHAIN_OUTPUTS",
                         "MPGEMM_FUSED_MAX_POOL", "MPGEMM_DGRAD_ADDEND", "MPGEMM_DEPTHWISE_SLIDING_WGRAD",
                         "MPGEMM_DEPTHWISE_SLIDING_GATHER", "MPGEMM_CONV_N16_TILE", "MPGEMM_LAYER_NORM_KERNEL")


def kernel_paths():
    """{variable: value} of the kernel-choosing variables set in this process."""
    return {name: os.environ[name] for name in KERNEL_PATH_VARIABLES if os.environ.get(name)}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def describe(device):
    """A dict naming what a measurement ran on and when."""
    import torch

    from . import gpu_state

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "gpu_measurement": on_gpu,
        "driver_version": gpu_state.driver_version() if on_gpu else None,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if on_gpu else None,
        "git_commit": git_commit(),
        "date": utc_now(),
        "kernel_paths": kernel_paths(),
    }


def headline(info):
    """One line: device, driver, versions, commit, date."""
    driver = f", driver {info['driver_version']}" if info.get("driver_version") else ""
    paths = "".join(f", {name}={value}" for name, value in (info.get("kernel_paths") or {}).items())
    return (f"{info['device']}{driver}, torch {info['torch_version']} (CUDA {info['cuda_version']}), "
            f"commit {info['git_commit']}, {info['date']}{paths}")


if __name__ == "__main__":
    print(git_commit())
