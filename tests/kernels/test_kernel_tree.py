"""The kernel tree's rules, read from the sources: production code knows
nothing of its tests (the simulation swaps the instruction layer, arch/, by
putting its own folder ahead of it on the include path), every include is
written from the tree's root so that the swap reaches it, every PTX wrapper
has its simulated counterpart, and the tile types are the one source of the
tile table."""

import glob
import os
import re

import mpgemm
from support import ROOT

KERNELS = os.path.join(ROOT, "csrc", "kernels")
SIM_ARCH = os.path.join(ROOT, "tests", "kernels", "kernel_sim", "arch")
SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.*"), recursive=True))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read(path):
    with open(path) as f:
        return f.read()


def relative(path):
    return os.path.relpath(path, ROOT)


def test_production_code_names_no_test_file_and_no_simulation():
    assert SOURCES
    found = [f"{relative(path)}: {word}" for path in SOURCES
             for word in ("MPGEMM_KERNEL_SIM", "kernel_sim", "sim::", "tests/") if word in read(path)]
    assert not found, "\n".join(found)


def test_kernel_includes_are_written_from_the_root_of_the_tree():
    # An include of a file beside the includer ("cp_async.cuh" from arch/)
    # would find the production file before any -I folder: the simulation
    # could not swap it.
    for path in glob.glob(os.path.join(KERNELS, "**", "*.*"), recursive=True):
        for name in INCLUDE.findall(read(path)):
            assert "/" in name and os.path.exists(os.path.join(KERNELS, name)), f"{relative(path)}: \"{name}\""


def test_every_ptx_wrapper_has_a_simulated_counterpart():
    production = {os.path.basename(p) for p in glob.glob(os.path.join(KERNELS, "arch", "*"))
                  if "asm" in read(p)}
    simulated = {os.path.basename(p) for p in glob.glob(os.path.join(SIM_ARCH, "*"))}
    assert production and simulated == production


def test_tile_table_is_the_tile_types():
    # One row per tile type, in the order of TileConfigId, each named once,
    # its numbers consistent with one another.
    source = read(os.path.join(KERNELS, "common", "tile_configs.h"))
    declared = re.findall(r'^MPGEMM_TILE_CONFIG\((\w+), (\w+), "(\w+)"', source, re.M)
    rows = mpgemm.tile_configs()
    assert [(c["type"], c["name"]) for c in rows] == [(t, name) for t, _, name in declared]
    for c in rows:
        warps_m, warps_n = c["block_m"] // c["warp_m"], c["block_n"] // c["warp_n"]
        if c["wgmma"]:  # a producer warpgroup and two consumers, however they share the tile
            assert c["threads"] == 3 * 128 and c["schedule"] in ("cooperative", "pingpong") and c["min_arch"] == 90, c
        else:
            assert c["threads"] == 32 * warps_m * warps_n and c["schedule"] == "" and c["cluster_m"] == 1, c
        assert c["narrowest_load"] <= c["load_width"] and c["smem_bytes"] > 0, c
