"""Which tile configuration a GEMM gets, and the per-device tuning cache.

The choice itself is made in C++ (csrc/kernels/plan/gemm_plan.h: the table of
tile configurations and a heuristic), so this module, the CUDA launcher and the
host simulation all give the same answer, on CPU-only builds too. A tuned
choice for an exact shape overrides the heuristic once installed in the
process (`load_tuning`, or `mpgemm.tune_gemm`, which measures and saves it).
The library only reads and writes the cache; the timing lives in
mpgemm.tools.tuning.
"""

import dataclasses
import json
import numbers
import os
import re

import torch

from . import _C

CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """How a GEMM runs: the tile configuration `config` (block_m x block_n
    tiles, K slices of block_k, `warps` warps, `stages` shared-memory stages,
    loads of `load_width` elements, blocks in clusters of `cluster_m` along M
    that share B's copies), K split into `split_k` ranges summed by a
    deterministic reduction, tiles visited in groups of `raster_group` tile
    rows (of cluster tiles); `tuned` says the choice came from the tuning
    cache; `padded_operands`, that a Hopper plan runs on copies of operands
    the copy engine cannot describe as they lie, their rows or columns
    moved to 16-byte aligned pitches (MPGEMM_PADDED_OPERANDS=1);
    `stream_k_blocks`, where not 0, that the plan's Hopper tile (128 x
    256, or a narrow 128 x 128 or 128 x 64) runs stream-K on that many
    blocks, each an equal run of all the tiles' K slices, a tile split
    between runs summed by the block that ends it (MPGEMM_STREAM_K=1).
    `workspace_bytes`: the device memory the launch takes beyond its output
    (those copies; split-K's fp32 partial sums, split_k x M x N x 4 bytes;
    stream-K's, an fp32 tile a block, and its flags), from torch's caching
    allocator for the call."""

    config: str
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    load_width: int
    cluster_m: int
    smem_bytes: int
    split_k: int
    raster_group: int
    tuned: bool
    padded_operands: bool
    workspace_bytes: int
    stream_k_blocks: int = 0


def tile_configs():
    """The table of tile configurations, as dicts (name, type: the C++ type
    the kernels are instantiated on, block_m, block_n, block_k, warp_m,
    warp_n, stages, threads, min_blocks_per_sm, smem_bytes, min_arch,
    load_width and narrowest_load: the widest and narrowest loads in
    elements, cluster_m, wgmma: a Hopper tile, schedule: its consumers'
    "cooperative" or "pingpong", "" for the WMMA tiles), derived from the
    tile types of csrc/kernels/common/tile_configs.h. "wgmma_m64" (the
    Hopper convolution's wgrad of at most 64 filters) and "n16" (the WMMA
    convolution's fprop and dgrad of at most 16 filters or channels per
    group) are the convolutions' own: the GEMM has no kernels on them, and
    its plans never name them."""
    return _C.tile_configs()


def device_limits(device=None):
    """{"multiprocessors", "max_smem_per_block", "arch"} of a CUDA device (the
    current one by default), or of an H100 where no GPU is available."""
    if not torch.cuda.is_available():
        return _C.default_device_limits()
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return {"multiprocessors": props.multi_processor_count,
            "max_smem_per_block": props.shared_memory_per_block_optin,
            "arch": 10 * props.major + props.minor}


def _check_size(name, value, minimum=0):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"mpgemm.gemm_plan: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# Elements per global load that operands may allow, widest first.
LOAD_WIDTHS = (8, 4, 2, 1)


def _problem(m, n, k, batch, load_width, limits):
    limits = device_limits() if limits is None else limits
    missing = {"multiprocessors", "max_smem_per_block", "arch"} - set(limits)
    if missing:
        raise ValueError(f"mpgemm.gemm_plan: device_limits lacks {sorted(missing)}")
    if not isinstance(load_width, numbers.Integral) or isinstance(load_width, bool) or load_width not in LOAD_WIDTHS:
        raise ValueError("mpgemm.gemm_plan: load_width must be 8, 4, 2 or 1 (elements per load that both operands "
                         f"allow), got {load_width!r}")
    return (_check_size("batch", batch, 1), _check_size("m", m), _check_size("n", n), _check_size("k", k),
            int(load_width), int(limits["multiprocessors"]), int(limits["max_smem_per_block"]), int(limits["arch"]))


def _as_plan(entry, load_width):
    config = next(c for c in _C.tile_configs() if c["name"] == entry["config"])
    # A 16-byte tile runs at the operands' width where they allow less, but on padded copies at its own.
    width = config["load_width"] if entry["padded_operands"] else min(config["load_width"], load_width)
    return GemmPlan(config=config["name"], block_m=config["block_m"], block_n=config["block_n"],
                    block_k=config["block_k"],
                    warps=config["threads"] // 32,
                    stages=config["stages"], load_width=width,
                    cluster_m=config["cluster_m"],
                    smem_bytes=config["smem_bytes"],
                    split_k=entry["split_k"], raster_group=entry["raster_group"], tuned=entry["tuned"],
                    padded_operands=entry["padded_operands"], workspace_bytes=entry["workspace_bytes"],
                    stream_k_blocks=entry["stream_k_blocks"])


def operand_load_width(t):
    """The widest load (8, 4, 2 or 1 elements) that the GEMM launcher can use
    on the CUDA operand `t` (a matrix or a batch of them): its base aligned to
    the load's bytes, and its leading dimension, batch stride and contiguous
    extent multiples of it. The layout is the launcher's: row- or
    column-major in place (a dimension of size 1 taking the layout whose
    contiguous extent is longer; a batch of one broadcast), anything else a
    fresh row-major copy. The rule is the launcher's own (C++)."""
    batch = t.shape[0] if t.dim() == 3 else 1
    return _C.operand_load_width(t.data_ptr(), t.shape[-2], t.shape[-1], t.stride(-2), t.stride(-1), batch,
                                 t.stride(0) if batch > 1 else 0)


def gemm_plan(m, n, k, *, batch=1, load_width=8, device_limits=None):
    """The plan `mpgemm.gemm` runs an (m x k) @ (k x n) product with (times
    `batch`) on a device with `device_limits` (a dict as `device_limits()`
    returns; by default the current GPU's, or an H100's without one).

    `load_width`: the elements per load that both operands allow (the
    narrower of `operand_load_width` of each): 8 for 16-byte aligned data
    whose leading dimensions, batch strides and contiguous extents are
    multiples of 8 elements; 4 or 2 for 8- or 4-byte chunks, which the tiles
    below load with narrower cp.async; 1 for anything else, on the
    one-element path. The rule, in order: on sm_90 operands of width 8 take
    the Hopper kernels (which need a build with sm_90a code: an arch list
    holding 9.0). A single matrix of at least 128 rows and more than 128
    columns whose K the split cost model splits on the 128 x 256 tile runs
    "wgmma" with that `split_k` (at most 16), the splits' fp32 sums reduced
    in split order, where the model finds the split at least 1.1x as fast
    as the Hopper plan of whole K (the model's rates fitted to this GEMM's
    kernel times on an H200) and MPGEMM_GEMM_PATH forces no Hopper kernel;
    MPGEMM_WGMMA_SPLIT_K=1 takes the split wherever the model splits (with
    MPGEMM_GEMM_PATH=wgmma too), "0" never. With MPGEMM_STREAM_K=1 (opt-in
    until its GPU run), ahead of
    that, a single matrix of at least 128 rows whose tiles fill the
    multiprocessors poorly runs stream-K (`stream_k_blocks`: each block an
    equal run of the tiles' K slices) where its cost model says so: on
    "wgmma" for more than 128 columns, on "wgmma_n128" for 65 to 128 and
    "wgmma_n64" for at most 64 (unless MPGEMM_NARROW_TILES=0), in place of
    the narrow tile's whole K or WMMA's split; also where MPGEMM_GEMM_PATH
    names that tile. With MPGEMM_PADDED_OPERANDS=1 (opt-in too)
    operands of a narrower width take the Hopper kernels on copies at
    16-byte aligned pitches (`padded_operands`) where the copies' bytes cost
    less than the Hopper path saves (at least 350 FLOP per byte copied), or
    where a Hopper kernel is forced. A width alone cannot say which operand
    needs the copy, whether one broadcasts over the batch, or whether a
    narrow width still has 16-byte aligned pitches (a slice of a wider
    tensor): this plan counts both operands copied, every matrix, where the
    launcher copies only what the copy engine cannot describe, so its
    choice and workspace for such problems can differ from the launch's.
    Otherwise, unless the WMMA rule below would split K: ping-pong
    consumers on pairs of blocks, "wgmma_pingpong", where the 128 x 256
    tiles of blocks alone (times the batch) fill at most half the
    multiprocessors, else blocks alone, "wgmma"; outputs of at most 128
    columns take a narrow tile instead (unless MPGEMM_NARROW_TILES=0): "wgmma_n64" (128 x 64) up to 64
    columns or where 128 x 128 tiles would fill at most half the
    multiprocessors, else "wgmma_n128" (MPGEMM_GEMM_PATH=wgmma,
    =wgmma_2x1, =wgmma_pingpong, =wgmma_n128 or =wgmma_n64 takes that
    kernel everywhere it can run, split-K shapes too; =wmma never the
    Hopper path); width 1 takes
    the "scalar" tile; else the first of "tall" (m > n) or
    "wide", "square" (width 8 alone), "compact" that the device's shared
    memory and arch hold and whose tiles give every multiprocessor a block,
    failing all "small".
    Split-K when a single matrix's tiles fill at most half the multiprocessors
    and K holds at least 8 slices: min(multiprocessors / tiles rounded up,
    slices / 4, 16) splits. Tiles go in groups of min(8, tile rows) rows.
    A tuned entry for this exact shape wins where the device can run it."""
    return _as_plan(_C.gemm_plan(*_problem(m, n, k, batch, load_width, device_limits)), load_width)


def candidate_plans(m, n, k, *, batch=1, load_width=8, device_limits=None):
    """Every plan worth timing for the shape: each configuration the device
    holds, with split_k 1, 2, 4, ... (at most one K slice per split) and the
    heuristic's own choice."""
    return [_as_plan(p, load_width)
            for p in _C.gemm_candidates(*_problem(m, n, k, batch, load_width, device_limits))]


# ---- the tuning cache -------------------------------------------------------

def tuning_cache_dir():
    """$MPGEMM_CACHE_DIR/tuning if set, else ~/.cache/mpgemm/tuning."""
    root = os.environ.get("MPGEMM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "mpgemm")
    return os.path.join(root, "tuning")


def device_key(device=None):
    """(device name, arch) of a CUDA device, which names its cache file."""
    if not torch.cuda.is_available():
        raise RuntimeError("mpgemm: no CUDA device; pass device_name and arch to name the tuning cache")
    index = device if device is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), 10 * major + minor


def tuning_cache_path(device_name, arch):
    """The cache file of one kind of device: <dir>/<device name>-sm<arch>.json."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", device_name).strip("_") or "device"
    return os.path.join(tuning_cache_dir(), f"{safe}-sm{int(arch)}.json")


def read_tuning(device_name, arch):
    """The cached entries of a device ([] without a cache file): dicts with
    batch, m, n, k, config, split_k, time_ms, and stream_k where the plan
    timed ran stream-K (MPGEMM_STREAM_K=1; an entry without it did not)."""
    path = tuning_cache_path(device_name, arch)
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("version") != CACHE_VERSION:
            return []  # written by another version of mpgemm: tune again
        entries = data["entries"]
        for e in entries:
            for key in ("batch", "m", "n", "k", "config", "split_k"):
                e[key]  # noqa: B018  (every entry must have them)
        return entries
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"mpgemm: unreadable tuning cache {path} ({err}); remove it with "
                         "mpgemm.clear_tuning_cache()") from err


def write_tuning(entries, device_name, arch):
    """Merges `entries` into the device's cache file (a later entry for the
    same shape replaces an earlier one); returns the path."""
    merged = {(e["batch"], e["m"], e["n"], e["k"]): e for e in read_tuning(device_name, arch)}
    merged.update({(e["batch"], e["m"], e["n"], e["k"]): e for e in entries})
    path = tuning_cache_path(device_name, arch)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = {"version": CACHE_VERSION, "device": device_name, "arch": int(arch),
            "entries": sorted(merged.values(), key=lambda e: (e["batch"], e["m"], e["n"], e["k"]))}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # readers never see half a file
    return path


def install_tuning(entries):
    """Makes this process's GEMMs of these exact shapes use the tuned plans."""
    for e in entries:
        _C.set_tuned_gemm_plan(e["batch"], e["m"], e["n"], e["k"], e["config"], e["split_k"], e.get("stream_k", False))


def load_tuning(device=None, *, device_name=None, arch=None):
    """Installs the cached tuned plans of a device (the current GPU by
    default) in this process; returns how many there were."""
    if device_name is None or arch is None:
        device_name, arch = device_key(device)
    entries = read_tuning(device_name, arch)
    install_tuning(entries)
    return len(entries)


def clear_tuning_cache():
    """Deletes every cached tuning file and forgets the tuned plans installed
    in this process; returns the paths removed."""
    _C.clear_tuned_gemm_plans()
    directory = tuning_cache_dir()
    removed = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json"):
                os.remove(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
    return removed
