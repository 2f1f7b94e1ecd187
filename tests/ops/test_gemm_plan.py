"""The tile choice (mpgemm.gemm_plan, csrc/kernels/plan/gemm_plan.h) and the
tuning cache, on the host: no GPU needed."""

import json
import os

import pytest
import torch

import mpgemm
from mpgemm import plan as gemm_plans
from mpgemm.tools.tuning import tune_gemm

from support import set_environment

H100 = {"multiprocessors": 132, "max_smem_per_block": 227 * 1024, "arch": 90}
A100 = {"multiprocessors": 108, "max_smem_per_block": 163 * 1024, "arch": 80}
SM86 = {"multiprocessors": 82, "max_smem_per_block": 99 * 1024, "arch": 86}
SM75 = {"multiprocessors": 40, "max_smem_per_block": 64 * 1024, "arch": 75}


@pytest.fixture(autouse=True)
def no_tuning(tmp_path, monkeypatch):
    """Each test starts with an empty tuned table and cache of its own."""
    monkeypatch.setenv("MPGEMM_CACHE_DIR", str(tmp_path / "cache"))
    mpgemm.clear_tuning_cache()
    yield
    mpgemm.clear_tuning_cache()


def test_table_lists_every_configuration_once():
    configs = mpgemm.tile_configs()
    names = [c["name"] for c in configs]
    assert names == ["wide", "tall", "square", "compact", "small", "scalar", "wgmma", "wgmma_2x1", "wgmma_pingpong",
                     "wgmma_n128", "wgmma_n64", "wgmma_m64", "n16"]
    by_name = {c["name"]: c for c in configs}
    assert (by_name["wide"]["block_m"], by_name["wide"]["block_n"], by_name["wide"]["block_k"]) == (128, 256, 64)
    assert by_name["scalar"]["load_width"] == 1 and by_name["small"]["load_width"] == 8
    assert all(c["threads"] == 32 * (c["block_m"] // c["warp_m"]) * (c["block_n"] // c["warp_n"])
               for c in configs if not c["name"].startswith("wgmma"))
    assert [c["name"] for c in configs if c["cluster_m"] != 1] == ["wgmma_2x1", "wgmma_pingpong"]
    # The Hopper tile: two consumer warpgroups of 64 x 256 and one producer, 4 stages of 48 KB.
    hopper = by_name["wgmma"]
    assert (hopper["block_m"], hopper["block_n"], hopper["block_k"], hopper["stages"]) == (128, 256, 64, 4)
    assert (hopper["warp_m"], hopper["warp_n"], hopper["threads"], hopper["min_arch"]) == (64, 256, 384, 90)
    assert 4 * 48 * 1024 < hopper["smem_bytes"] <= 227 * 1024
    # Its pairs: the same tile and ring, two blocks to a cluster along M.
    pair = by_name["wgmma_2x1"]
    assert {k: v for k, v in pair.items() if k not in ("name", "type", "cluster_m")} == \
        {k: v for k, v in hopper.items() if k not in ("name", "type", "cluster_m")}
    assert (hopper["cluster_m"], pair["cluster_m"]) == (1, 2)
    # Ping-pong: pairs whose consumers each take a whole 64 x 256 tile, 4 stages of 40 KB.
    ping_pong = by_name["wgmma_pingpong"]
    assert (ping_pong["block_m"], ping_pong["block_n"], ping_pong["block_k"], ping_pong["stages"]) == (64, 256, 64, 4)
    assert (ping_pong["warp_m"], ping_pong["warp_n"], ping_pong["threads"], ping_pong["cluster_m"]) == \
        (64, 256, 384, 2)
    assert hopper["smem_bytes"] - ping_pong["smem_bytes"] == 4 * 64 * 64 * 2  # 64 rows of A fewer in each stage
    # The narrow tiles: blocks alone, 128 x 128 in 6 stages of 32 KB and 128 x 64 in 8 of 24 KB, as much of
    # the 227 KB as the wide tile's ring takes.
    for name, block_n, stages in (("wgmma_n128", 128, 6), ("wgmma_n64", 64, 8)):
        narrow = by_name[name]
        assert (narrow["block_m"], narrow["block_n"], narrow["stages"], narrow["cluster_m"]) == (128, block_n, stages, 1)
        assert (narrow["warp_n"], narrow["threads"], narrow["schedule"]) == (block_n, 384, "cooperative")
        assert stages * (128 + block_n) * 64 * 2 < narrow["smem_bytes"] <= 227 * 1024
    # The convolution's wgrad tile of at most 64 filters: ping-pong's 64 x 256 tiles and ring, on blocks alone.
    m64 = by_name["wgmma_m64"]
    assert {k: v for k, v in m64.items() if k not in ("name", "type", "cluster_m")} == \
        {k: v for k, v in ping_pong.items() if k not in ("name", "type", "cluster_m")}
    assert (m64["cluster_m"], m64["schedule"]) == (1, "pingpong")
    # The convolution's fprop and dgrad tile of at most 16 columns: 4 warps of 32 x 16, 3 stages of 64-deep
    # slices (three blocks in a multiprocessor's shared memory on sm_90, two on sm_80), registers for three,
    # 16- and 8-byte chunks, from sm_80 on.
    n16 = by_name["n16"]
    assert (n16["block_m"], n16["block_n"], n16["block_k"], n16["warp_m"], n16["warp_n"]) == (128, 16, 64, 32, 16)
    assert (n16["threads"], n16["stages"], n16["min_arch"], n16["load_width"], n16["narrowest_load"]) == \
        (128, 3, 80, 8, 4)
    assert (n16["min_blocks_per_sm"], n16["wgmma"]) == (3, False)
    assert 3 * (128 + 16) * 64 * 2 < n16["smem_bytes"] <= 64 * 1024
    # The large tiles need the big shared memory of sm_80+; compact is for 64-100 KB devices.
    assert by_name["wide"]["smem_bytes"] > 160 * 1024 and by_name["compact"]["smem_bytes"] <= 64 * 1024


@pytest.mark.parametrize("m, n, config", [(4096, 4096, "wide"), (8192, 8192, "wide"), (8192, 2048, "tall"),
                                          (2048, 8192, "wide"), (16384, 64, "small"), (100000, 256, "tall")])
def test_big_problems_take_the_largest_tiles(m, n, config, monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "wmma")  # the WMMA rules, which H100s also run without the Hopper path
    plan = mpgemm.gemm_plan(m, n, 4096, device_limits=H100)
    assert (plan.config, plan.split_k, plan.tuned) == (config, 1, False)
    assert plan.raster_group == min(8, -(-m // plan.block_m))


def test_problems_short_of_a_wave_take_smaller_tiles(monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "wmma")
    assert mpgemm.gemm_plan(1024, 1024, 1024, device_limits=H100).config == "small"  # 32 wide tiles < 132
    assert mpgemm.gemm_plan(1536, 1536, 1024, device_limits=H100).config == "square"  # 144 square tiles
    assert mpgemm.gemm_plan(512, 512, 1024, batch=64, device_limits=H100).config == "wide"  # batch fills the GPU


@pytest.mark.parametrize("m, n, k, split_k", [(64, 64, 16384, 16), (128, 256, 8192, 16), (16, 4096, 4096, 3),
                                              (1024, 1024, 16384, 4),  # on the Hopper block (below)
                                              (64, 64, 448, 1), (64, 64, 512, 2)])
def test_split_k_for_small_outputs_with_long_k(m, n, k, split_k):
    plan = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    assert plan.split_k == split_k
    assert plan.split_k <= 16 and (plan.split_k == 1 or -(-k // plan.block_k) >= 4 * plan.split_k)


@pytest.mark.parametrize("m, n, k, batch", [(4096, 4096, 4096, 1), (8192, 2048, 4096, 1), (1536, 1536, 1536, 1),
                                            (512, 512, 1024, 64), (1024, 1024, 1024, 3), (128 * 67, 256, 4096, 1)])
def test_hopper_path_by_default_on_sm90(m, n, k, batch):
    """Blocks alone where their 128 x 256 tiles (times the batch) fill more
    than half of the multiprocessors."""
    plan = mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=H100)
    assert (plan.config, plan.split_k, plan.warps, plan.stages) == ("wgmma", 1, 12, 4)
    assert plan.raster_group == min(8, -(-m // 128))
    # Not on other archs: sm_90a code runs on compute capability 9.0 alone.
    for limits in (A100, SM86, SM75, dict(H100, arch=100)):
        assert not mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=limits).config.startswith("wgmma")


@pytest.mark.parametrize("m, n, k, batch", [(1024, 1024, 1024, 1), (1024, 1024, 2048, 1), (768, 768, 2048, 1),
                                            (128 * 66, 256, 4096, 1), (1024, 1024, 1024, 2)])
def test_ping_pong_by_default_where_blocks_alone_leave_half_the_gpu_idle(m, n, k, batch):
    """At most 66 tiles of 128 x 256 on 132 multiprocessors: ping-pong's
    64 x 256 tiles, 1.3x to 1.7x faster on three of the four such shapes
    timed on an H200 and a tie on the fourth (bench/NOTES.md). Outputs of
    at most 128 columns take the narrow tiles instead
    (test_narrow_tiles_by_default_and_only_where_they_fit), long K a split
    on the 128 x 256 tile where it pays
    (test_split_k_on_the_hopper_block_by_default_where_it_pays)."""
    plan = mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=H100)
    assert (plan.config, plan.cluster_m, plan.split_k) == ("wgmma_pingpong", 2, 1)
    for limits in (A100, SM86, SM75, dict(H100, arch=100)):
        assert not mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=limits).config.startswith("wgmma")


@pytest.mark.parametrize("m, n, k", [(64, 64, 16384), (16, 4096, 4096), (256, 256, 8192), (512, 512, 512)])
def test_small_outputs_with_long_k_split_on_wmma_tiles_instead(m, n, k):
    """Where WMMA's rule splits K, its smaller tiles fill the GPU that a few
    128 x 256 tiles would leave idle (measured up to 9x faster on an H100)."""
    plan = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    assert plan.config != "wgmma" and plan.split_k > 1


def forced_path(path):
    return path.startswith("wgmma")


@pytest.mark.parametrize("path", ["wmma", "auto", "wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64",
                                  ""])
def test_the_environment_switches_the_hopper_path(path, monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
    hopper = path if path in ("wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64") else "wgmma"
    assert (mpgemm.gemm_plan(4096, 4096, 4096, device_limits=H100).config == hopper) == (path != "wmma")
    assert (mpgemm.gemm_plan(1024, 1024, 1024, device_limits=H100).config ==
            (hopper if forced_path(path) else "wgmma_pingpong")) == (path != "wmma")
    # The Hopper paths are forced even where the heuristic would split K on WMMA tiles.
    forced = forced_path(path)
    assert (mpgemm.gemm_plan(64, 64, 16384, device_limits=H100).config == hopper) == forced
    assert not mpgemm.gemm_plan(4096, 4096, 4096, device_limits=A100).config.startswith("wgmma")


@pytest.mark.parametrize("path, cluster_rows", [("wgmma_2x1", 256), ("wgmma_pingpong", 128)])
def test_pairs_of_blocks_count_their_tile_rows_in_cluster_tiles(path, cluster_rows, monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
    for m in (64, 128, 256, 257, 1000, 4096):
        plan = mpgemm.gemm_plan(m, 4096, 4096, device_limits=H100)
        assert (plan.config, plan.cluster_m, plan.split_k) == (path, 2, 1)
        assert plan.raster_group == min(8, -(-m // cluster_rows)), m
    # A pair needs two multiprocessors.
    assert mpgemm.gemm_plan(4096, 4096, 4096, device_limits=dict(H100, multiprocessors=1)).config != path


@pytest.mark.parametrize("tuned", ["wgmma_2x1", "wgmma_pingpong"])
def test_pairs_are_a_tuning_candidate_and_a_tuned_choice(tuned):
    candidates = mpgemm.plan.candidate_plans(4096, 4096, 4096, device_limits=H100)
    assert [p.config for p in candidates if p.config.startswith("wgmma") and p.split_k == 1] == \
        ["wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64"]
    assert mpgemm.gemm_plan(4096, 4096, 4096, device_limits=H100).config == "wgmma"  # measured fastest there
    gemm_plans.install_tuning([{"batch": 1, "m": 4096, "n": 4096, "k": 4096, "config": tuned, "split_k": 1}])
    plan = mpgemm.gemm_plan(4096, 4096, 4096, device_limits=H100)
    assert (plan.config, plan.cluster_m, plan.tuned) == (tuned, 2, True)
    # A device without the Hopper path falls back to the heuristic.
    assert mpgemm.gemm_plan(4096, 4096, 4096, device_limits=A100).config == "wide"


def test_a_bad_path_is_named(monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "hopper")
    with pytest.raises(ValueError,
                       match="MPGEMM_GEMM_PATH must be 'auto', 'wgmma', 'wgmma_2x1', 'wgmma_pingpong', "
                             "'wgmma_n128', 'wgmma_n64' or 'wmma', got 'hopper'"):
        mpgemm.gemm_plan(4096, 4096, 4096, device_limits=H100)
    with pytest.raises(ValueError, match="MPGEMM_GEMM_PATH"):
        mpgemm.plan.candidate_plans(4096, 4096, 4096, device_limits=H100)


@pytest.mark.parametrize("m, n, k, batch, narrow", [
    (16384, 64, 4096, 1, "wgmma_n64"), (16384, 1, 4096, 1, "wgmma_n64"),
    (16384, 128, 4096, 1, "wgmma_n128"),  # 128 tiles of 128 x 128: more than half of 132
    (8192, 128, 4096, 1, "wgmma_n64"),  # 64 of them: 128 x 64 tiles instead, 128 of those
    (4096, 128, 4096, 1, "wgmma_n64"), (2048, 100, 1024, 8, "wgmma_n128"), (4096, 129, 4096, 1, None),
    (4096, 4096, 4096, 1, None)])
def test_narrow_tiles_by_default_and_only_where_they_fit(m, n, k, batch, narrow, monkeypatch):
    """The narrow tiles (the default on sm_90 since they passed the GPU
    tests and measured faster on an H100, 2026-11-28; MPGEMM_NARROW_TILES=0
    turns them off) put outputs of at most 128 columns that take the Hopper
    path on them: 128 x 64 up to 64 columns, or up to 128 where 128 x 128
    tiles would fill at most half of the multiprocessors; never wider
    outputs and never other archs."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.setenv("MPGEMM_NARROW_TILES", "0")
    wide = mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=H100)
    assert wide.config in ("wgmma", "wgmma_pingpong")
    for value in (None, "1"):
        set_environment(monkeypatch, "MPGEMM_NARROW_TILES", value)
        plan = mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=H100)
        if narrow is None:
            assert plan == wide  # 129 columns: split 4 ways on the 128 x 256 tile
        else:
            assert (plan.config, plan.split_k, plan.cluster_m) == (narrow, 1, 1)
        assert not mpgemm.gemm_plan(m, n, k, batch=batch, device_limits=A100).config.startswith("wgmma")


def test_narrow_tiles_leave_wmma_split_k_where_the_rule_splits(monkeypatch):
    """4096 x 64 x 4096 splits K on WMMA tiles (64 small tiles, 64 slices);
    the narrow tiles replace the wide Hopper tile, not the split (a split of
    K on the Hopper scheduler is issue 56's)."""
    monkeypatch.delenv("MPGEMM_NARROW_TILES", raising=False)
    plan = mpgemm.gemm_plan(4096, 64, 4096, device_limits=H100)
    assert plan.config == "small" and plan.split_k > 1


def test_a_bad_narrow_tiles_value_is_named(monkeypatch):
    monkeypatch.setenv("MPGEMM_NARROW_TILES", "yes")
    with pytest.raises(ValueError, match="MPGEMM_NARROW_TILES must be '0' or '1', got 'yes'"):
        mpgemm.gemm_plan(4096, 64, 4096, device_limits=H100)


def test_operands_the_copy_engine_cannot_describe_stay_on_wmma():
    assert mpgemm.gemm_plan(4095, 4097, 4093, load_width=1, device_limits=H100).config == "scalar"
    # 8-byte chunks: the WMMA tiles at that width, not the Hopper path's 16-byte copies.
    plan = mpgemm.gemm_plan(4096, 4096, 4092, load_width=4, device_limits=H100)
    assert (plan.config, plan.load_width) == ("wide", 4)


def test_batched_problems_do_not_split():
    assert mpgemm.gemm_plan(64, 64, 16384, batch=2, device_limits=H100).split_k == 1


def test_unaligned_operands_take_the_one_element_path():
    plan = mpgemm.gemm_plan(4095, 4097, 4093, load_width=1, device_limits=H100)
    assert (plan.config, plan.load_width) == ("scalar", 1)


@pytest.mark.parametrize("limits", [SM75, SM86])
def test_small_shared_memory_takes_compact_or_small_tiles(limits):
    assert mpgemm.gemm_plan(4096, 4096, 4096, device_limits=limits).config == "compact"
    assert mpgemm.gemm_plan(512, 512, 4096, device_limits=limits).config == "small"
    for m, n in [(8192, 8192), (100, 100), (64, 8192)]:
        plan = mpgemm.gemm_plan(m, n, 4096, device_limits=limits)
        assert plan.smem_bytes <= limits["max_smem_per_block"]


def test_default_limits_are_an_h100_without_a_gpu():
    assert gemm_plans.device_limits() == H100 or gemm_plans.device_limits()["multiprocessors"] > 0


@pytest.mark.parametrize("kwargs, name", [({"m": -1}, "m"), ({"k": 2.5}, "k"), ({"batch": 0}, "batch")])
def test_bad_sizes_are_named(kwargs, name):
    args = {"m": 8, "n": 8, "k": 8, **kwargs}
    batch = args.pop("batch", 1)
    with pytest.raises(ValueError, match=f"gemm_plan: {name} must be"):
        mpgemm.gemm_plan(args["m"], args["n"], args["k"], batch=batch, device_limits=H100)


def test_candidates_are_admissible_and_include_the_heuristic():
    candidates = gemm_plans.candidate_plans(128, 256, 8192, device_limits=SM86)
    assert {p.config for p in candidates} == {"compact", "small", "scalar"}
    assert all(p.smem_bytes <= SM86["max_smem_per_block"] for p in candidates)
    assert any(p.config == "small" and p.split_k == 11 for p in candidates)  # the heuristic's count
    assert all(p.split_k == 1 for p in gemm_plans.candidate_plans(64, 64, 8192, batch=2, device_limits=H100))
    assert all(p.config == "scalar" for p in gemm_plans.candidate_plans(64, 64, 64, load_width=1,
                                                                         device_limits=H100))
    # Square tiles copy 16-byte chunks alone.
    narrow = gemm_plans.candidate_plans(1024, 1024, 1024, load_width=2, device_limits=H100)
    assert {p.config for p in narrow} == {"wide", "tall", "compact", "small", "scalar"}
    assert {p.load_width for p in narrow} == {2, 1}


def fake_time(shape, plan):
    """Square tiles with 2 splits win, then square tiles unsplit; everything else is slower."""
    if plan.config == "square":
        return 1.0 if plan.split_k == 2 else 2.0 + plan.split_k
    return 50.0 + plan.split_k


def test_tuning_round_trip_and_clearing(tmp_path):
    chosen = tune_gemm([(512, 512, 4096), (2, 256, 256, 1024)], time_fn=fake_time, device_name="Fake GPU/X",
                       arch=90, device_limits=H100)
    assert [(c["config"], c["split_k"]) for c in chosen] == [("square", 2), ("square", 1)]
    path = gemm_plans.tuning_cache_path("Fake GPU/X", 90)
    assert path.startswith(str(tmp_path / "cache" / "tuning")) and path.endswith("Fake_GPU_X-sm90.json")
    with open(path) as f:
        assert len(json.load(f)["entries"]) == 2

    # Installed in this process: the plan says so.
    plan = mpgemm.gemm_plan(512, 512, 4096, device_limits=H100)
    assert (plan.config, plan.split_k, plan.tuned) == ("square", 2, True)
    # Not where the device cannot run it: the heuristic answers.
    assert not mpgemm.gemm_plan(512, 512, 4096, device_limits=SM86).tuned
    # Another shape is untouched.
    assert not mpgemm.gemm_plan(512, 512, 4095, device_limits=H100).tuned

    # A fresh process (the table cleared) reads it back from disk.
    gemm_plans._C.clear_tuned_gemm_plans()
    assert not mpgemm.gemm_plan(512, 512, 4096, device_limits=H100).tuned
    assert mpgemm.load_tuning(device_name="Fake GPU/X", arch=90) == 2
    assert mpgemm.gemm_plan(512, 512, 4096, device_limits=H100).tuned

    assert mpgemm.clear_tuning_cache() == [path]
    assert not os.path.exists(path)
    assert not mpgemm.gemm_plan(512, 512, 4096, device_limits=H100).tuned
    assert mpgemm.load_tuning(device_name="Fake GPU/X", arch=90) == 0


def test_retuning_merges_shapes():
    tune_gemm([(512, 512, 4096)], time_fn=fake_time, device_name="Fake", arch=80, device_limits=A100)
    tune_gemm([(256, 256, 4096)], time_fn=fake_time, device_name="Fake", arch=80, device_limits=A100)
    assert len(gemm_plans.read_tuning("Fake", 80)) == 2


def test_a_corrupt_cache_names_its_file_and_the_fix():
    path = gemm_plans.tuning_cache_path("Fake", 90)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="unreadable tuning cache .*Fake-sm90.json.*clear_tuning_cache"):
        mpgemm.load_tuning(device_name="Fake", arch=90)


def test_a_bad_tuned_config_is_refused():
    with pytest.raises(ValueError, match="no tile configuration named 'huge'"):
        gemm_plans._C.set_tuned_gemm_plan(1, 8, 8, 8, "huge", 1)
    with pytest.raises(ValueError, match="the GEMM has no kernels on 'wgmma_m64'"):
        gemm_plans._C.set_tuned_gemm_plan(1, 64, 4096, 4096, "wgmma_m64", 1)
    with pytest.raises(ValueError, match="the GEMM has no kernels on 'n16'"):
        gemm_plans._C.set_tuned_gemm_plan(1, 4096, 16, 4096, "n16", 1)
    with pytest.raises(ValueError, match="split_k must be in"):
        gemm_plans._C.set_tuned_gemm_plan(1, 8, 8, 8, "small", 17)


def test_operand_load_width_is_the_widest_chunk_the_launcher_can_copy():
    a = torch.randn(64, 96, dtype=torch.float16)
    width = gemm_plans.operand_load_width
    assert width(a) == 8 and width(a.t()) == 8  # row- and column-major
    assert width(a[:, :94]) == 2  # the contiguous extent
    assert width(a[:, 1:]) == 1  # a base 2 bytes past 16-byte alignment
    assert width(a[:, 4:]) == 4  # 8 bytes past
    batch = torch.randn(3, 8, 12, dtype=torch.float16)
    assert width(batch) == 4  # leading dimension and batch stride 12
    assert width(torch.randn(3, 8, 16, dtype=torch.float16)[:, :, :8]) == 8
    assert width(torch.randn(8, 16, dtype=torch.float16)[:, :8].expand(3, 8, 8)) == 8  # one matrix, broadcast
    # As the launcher lays them out: a size-1 dimension takes the layout with
    # the longer contiguous extent, a batch of one broadcasts, and operands
    # neither row- nor column-major are copied to row-major.
    assert width(torch.randn(64, 1, dtype=torch.float16)) == 8
    assert width(torch.randn(1, 64, dtype=torch.float16).t().t().as_strided((1, 64), (1, 1))) == 8
    assert width(torch.randn(1, 8, 12, dtype=torch.float16)) == 4
    assert width(torch.randn(1, 64, 16, dtype=torch.float16).movedim(1, 2)) == 8
    assert width(torch.randn(16, 32, dtype=torch.float16)[::2, ::2]) == 8


@pytest.mark.parametrize("load_width", [3, 16, True, 8.0])
def test_a_bad_load_width_is_named(load_width):
    with pytest.raises(ValueError, match="gemm_plan: load_width must be 8, 4, 2 or 1"):
        mpgemm.gemm_plan(64, 64, 64, load_width=load_width, device_limits=H100)


@pytest.mark.parametrize("limits", [H100, A100, SM86, SM75], ids=["h100", "a100", "sm86", "sm75"])
def test_split_k_workspace_is_bounded_by_the_device_not_the_problem(limits):
    """Split-K's fp32 partial sums: split_k x M x N x 4 bytes, and at most
    1.5 x multiprocessors tiles of fp32 however long K grows (on the Hopper
    block, 4 x multiprocessors tiles plus one split's: the bounds
    mpgemm/memory.py states)."""
    split = 0
    for m in (1, 64, 100, 256, 640, 1024):
        for n in (8, 64, 200, 512, 1024):
            for k in (64, 4096, 65536, 1 << 20):
                plan = mpgemm.gemm_plan(m, n, k, device_limits=limits)
                if plan.split_k == 1:
                    assert plan.workspace_bytes == 0
                    continue
                split += 1
                assert plan.workspace_bytes == plan.split_k * m * n * 4
                tile_bytes, tiles = plan.block_m * plan.block_n * 4, -(-m // plan.block_m) * -(-n // plan.block_n)
                # The Hopper block's splits: at most 4 x multiprocessors tiles plus one split's.
                most_tiles = 4 * limits["multiprocessors"] + tiles if plan.config == "wgmma" else \
                    1.5 * limits["multiprocessors"]
                assert plan.workspace_bytes <= most_tiles * tile_bytes, (m, n, k, plan)
    assert split >= 10


def test_no_workspace_on_the_cpu_backend():
    mpgemm.reset_workspace_stats()
    a, b = torch.randn(64, 4096).half(), torch.randn(4096, 64).half()
    mpgemm.gemm(a, b)
    assert mpgemm.workspace_stats() == {"calls": 0, "bytes": 0, "largest_bytes": 0}


def switched_plans(monkeypatch, switch, m, n, k):
    """The plans of (m, n, k) on an H100 with `switch` unset (the same with
    it "0", asserted) and with it "1"."""
    monkeypatch.delenv(switch, raising=False)
    off = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    monkeypatch.setenv(switch, "0")
    assert mpgemm.gemm_plan(m, n, k, device_limits=H100) == off
    monkeypatch.setenv(switch, "1")
    return off, mpgemm.gemm_plan(m, n, k, device_limits=H100)


def forced_plans(monkeypatch, m, n, k):
    """The plans of (m, n, k) with the wide Hopper tile forced (one matrix,
    and a batch of two) and ping-pong forced on an H100, and the default's on
    an A100."""
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "wgmma")
    plans = [mpgemm.gemm_plan(m, n, k, device_limits=H100), mpgemm.gemm_plan(m, n, k, batch=2, device_limits=H100)]
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "wgmma_pingpong")
    plans.append(mpgemm.gemm_plan(m, n, k, device_limits=H100))
    monkeypatch.delenv("MPGEMM_GEMM_PATH")
    return plans + [mpgemm.gemm_plan(m, n, k, device_limits=A100)]


# The Hopper GEMM on an H200 (fe39419, 2026-11-29; bench/results/
# 2026-11-29_h200_fe39419, wgmma_check's training sweep and speed table,
# fp16): (m, n, k), the whole-K plan's tile and its kernel time in us, the
# split of the 128 x 256 tile the cost model gives and its time (1024 x
# 1024 x 16384: the mean of the table's and the sweep's times). The
# default splits where the split measured at least 1.1x as fast, and keeps
# whole K elsewhere (1.04x to 1.09x faster split: within the timings'
# spread, left whole).
H200_SPLITS_MEASURED = [
    ((128, 4096, 4096), "wgmma_pingpong", 32.2, 5, 26.0),
    ((768, 768, 16384), "wgmma_pingpong", 93.9, 7, 43.5),   # GPT-2 small's attention wgrad, 16k tokens
    ((1024, 1024, 16384), "wgmma_pingpong", 94.6, 4, 62.6),
    ((3072, 768, 16384), "wgmma", 175.5, 3, 149.5),          # its MLP wgrads
    ((768, 3072, 16384), "wgmma", 173.5, 3, 147.5),
    ((768, 768, 2048), "wgmma_pingpong", 17.6, 4, 19.1),
    ((2048, 768, 3072), "wgmma_pingpong", 27.4, 2, 34.1),
    ((1024, 1024, 2048), "wgmma_pingpong", 19.2, 3, 24.8),
    ((2048, 1024, 3072), "wgmma_pingpong", 29.3, 2, 37.7),
    ((2048, 1024, 4096), "wgmma_pingpong", 36.9, 2, 43.0),
    ((2304, 768, 16384), "wgmma_pingpong", 105.6, 2, 111.7),
    ((3072, 1024, 16384), "wgmma", 191.8, 4, 184.3),
    ((1600, 6400, 16384), "wgmma", 602.3, 2, 571.7),
    ((1600, 1600, 16384), "wgmma", 187.3, 4, 174.7),
    ((4800, 1600, 16384), "wgmma", 545.7, 2, 502.1),
]


@pytest.mark.parametrize("shape, whole_config, whole_us, splits, split_us", H200_SPLITS_MEASURED)
def test_split_k_on_the_hopper_block_by_default_where_it_pays(shape, whole_config, whole_us, splits, split_us,
                                                               monkeypatch):
    """MPGEMM_WGMMA_SPLIT_K unset (the default): a single matrix of at least
    128 rows and more than 128 columns runs split-K on the 128 x 256 tile
    where the cost model finds the split at least 1.1x as fast as the
    whole-K plan; on the H200's measured shapes, exactly where it was. "1"
    takes the model's split wherever it splits; "0" never on this tile. A
    Hopper kernel forced by MPGEMM_GEMM_PATH runs whole K unless "1"."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.delenv("MPGEMM_STREAM_K", raising=False)
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "0")
    whole = mpgemm.gemm_plan(*shape, device_limits=H100)
    assert (whole.config, whole.split_k) == (whole_config, 1)
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "1")
    split = mpgemm.gemm_plan(*shape, device_limits=H100)
    assert (split.config, split.split_k, split.cluster_m) == ("wgmma", splits, 1)
    assert split.workspace_bytes == splits * shape[0] * shape[1] * 4
    monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K")
    assert mpgemm.gemm_plan(*shape, device_limits=H100) == (split if whole_us >= 1.1 * split_us else whole)
    for path in ("wgmma", "wgmma_pingpong"):
        monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
        assert mpgemm.gemm_plan(*shape, device_limits=H100).split_k == 1


@pytest.mark.parametrize("m, n, k, split_k", [
    (1024, 1024, 16384, 4), (128, 4096, 4096, 5), (300, 600, 3000, 8), (128, 264, 4104, 13), (768, 768, 2048, 4),
    (64, 64, 16384, None), (16, 4096, 4096, None), (4096, 128, 4096, None), (127, 4096, 4096, None),
    (4096, 4096, 4096, None), (1024, 1024, 1024, None)])
def test_split_k_on_the_hopper_block_where_the_cost_model_splits(m, n, k, split_k, monkeypatch):
    """MPGEMM_WGMMA_SPLIT_K=1: a single matrix of at least 128 rows and
    more than 128 columns whose K the split cost model (plan/split_cost.h)
    splits on the 128 x 256 tile runs "wgmma" split that many ways (at most
    16), in place of ping-pong or WMMA's split; narrower or shorter
    outputs, and products the model leaves whole, keep their plans. "0": no
    Hopper plan splits. Unset: the split where it pays (above), never in
    place of WMMA's split."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.delenv("MPGEMM_STREAM_K", raising=False)
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "0")
    unsplit = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    assert not (unsplit.config.startswith("wgmma") and unsplit.split_k > 1)
    monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K")
    by_default = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    if not unsplit.config.startswith("wgmma"):
        assert by_default == unsplit  # WMMA's split (or tile) stays
    else:
        assert by_default.config.startswith("wgmma")
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "1")
    plan = mpgemm.gemm_plan(m, n, k, device_limits=H100)
    if split_k is None:
        assert plan == unsplit == by_default
    else:
        assert (plan.config, plan.split_k, plan.cluster_m) == ("wgmma", split_k, 1)
        assert plan.workspace_bytes == split_k * m * n * 4
    # Forced onto the wide tile, it splits alike; a batch, another Hopper kernel forced, or another arch never.
    forced, batch, ping_pong, a100 = forced_plans(monkeypatch, m, n, k)
    assert (forced.split_k, batch.split_k, ping_pong.split_k) == (split_k or 1, 1, 1)
    assert not a100.config.startswith("wgmma")


def test_split_k_on_the_hopper_block_is_a_tuning_candidate_unless_switched_off(monkeypatch):
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.delenv("MPGEMM_STREAM_K", raising=False)

    def hopper_splits():
        return [p.split_k for p in mpgemm.plan.candidate_plans(1024, 1024, 16384, device_limits=H100)
                if p.config == "wgmma"]

    gemm_plans.install_tuning([{"batch": 1, "m": 1024, "n": 1024, "k": 16384, "config": "wgmma", "split_k": 2}])
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "0")
    assert hopper_splits() == [1]
    assert not mpgemm.gemm_plan(1024, 1024, 16384, device_limits=H100).tuned  # refused: switched off
    for value in (None, "1"):
        set_environment(monkeypatch, "MPGEMM_WGMMA_SPLIT_K", value)
        assert hopper_splits() == [1, 2, 4, 8, 16]
        plan = mpgemm.gemm_plan(1024, 1024, 16384, device_limits=H100)
        assert (plan.config, plan.split_k, plan.tuned) == ("wgmma", 2, True)


def test_a_bad_split_switch_is_named(monkeypatch):
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "yes")
    with pytest.raises(ValueError, match="MPGEMM_WGMMA_SPLIT_K must be '0' or '1', got 'yes'"):
        mpgemm.gemm_plan(64, 64, 64, device_limits=A100)


# (m, n, k): the tile of stream-K and its blocks on an H100's 132
# multiprocessors, or None where whole K costs as little by the model
# (plan/gemm_plan.h).
STREAM_K_SHAPES = [
    (768, 768, 16384, "wgmma", 132),   # GPT-2 small's attention wgrad at 16k tokens: 18 tiles
    (3072, 768, 16384, "wgmma", 132),  # its MLP wgrads: 72 tiles, one wave of 55%
    (2048, 2304, 768, "wgmma", 132),   # its qkv forward at 2k tokens: 144 tiles, a second wave of 12
    (2048, 768, 3072, "wgmma", 132),   # its MLP down-projection at 2k tokens: 48 tiles
    (1024, 1024, 1024, "wgmma", 128),  # 32 tiles of 16 slices: 512 slices, 4 a block
    (4096, 128, 4096, "wgmma_n128", 132),  # narrow: 32 tiles of 128 x 128 (whole K on 64 of 128 x 64)
    (4096, 64, 4096, "wgmma_n64", 132),    # 32 tiles of 128 x 64 (whole K: WMMA's split)
    (8192, 128, 8192, "wgmma_n128", 132),  # 64 tiles of 128 slices (whole K: 128 of 128 x 64)
    (4096, 4096, 4096, None, None),  # 512 tiles: 3.9 waves
    (16384, 768, 768, None, None),   # 384 tiles: 2.9 waves
    (2048, 768, 768, None, None),    # 48 tiles of 12 slices: runs of 5 and their fix-ups cost what the second wave saves
    (16384, 128, 4096, None, None),  # 128 tiles of 128 x 128: a wave 97% full
    (8192, 128, 1024, None, None),   # whole K on 128 of 128 x 64 (a wave 97% full), each slice 0.7 of 128 x 128's
    (64, 64, 16384, None, None),     # fewer rows than a tile: WMMA's split
    (127, 4096, 4096, None, None),   # fewer rows than a tile: ping-pong
]


@pytest.mark.parametrize("m, n, k, tile, blocks", STREAM_K_SHAPES)
def test_stream_k_where_its_model_says_it_is_faster(m, n, k, tile, blocks, monkeypatch):
    """MPGEMM_STREAM_K=1 (opt-in until its GPU run): a single matrix of at
    least 128 rows runs stream-K on min(multiprocessors, slices / 4) blocks
    where the cost model says so, whatever rules 0 to 3 chose (ping-pong,
    WMMA's split, a narrow tile's whole K): on the 128 x 256 tile for more
    than 128 columns, on 128 x 128 for 65 to 128 and 128 x 64 up to 64;
    the workspace holds a tile of fp32 a block and two flags. Unset or "0":
    no plan is stream-K. Under MPGEMM_GEMM_PATH naming its tile alike; a
    batch, another Hopper kernel forced, narrow tiles switched off for a
    narrow output, or another arch never."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K", raising=False)
    monkeypatch.delenv("MPGEMM_NARROW_TILES", raising=False)
    whole, plan = switched_plans(monkeypatch, "MPGEMM_STREAM_K", m, n, k)
    assert whole.stream_k_blocks == 0
    if blocks is None:
        assert plan == whole
    else:
        assert (plan.config, plan.split_k, plan.stream_k_blocks) == (tile, 1, blocks)
        assert plan.workspace_bytes == blocks * 128 * plan.block_n * 4 + -(-blocks * 2 * 4 // 16) * 16
        # It comes before the split's cost model.
        monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "1")
        assert mpgemm.gemm_plan(m, n, k, device_limits=H100) == plan
        monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K")
        monkeypatch.setenv("MPGEMM_GEMM_PATH", tile)
        assert mpgemm.gemm_plan(m, n, k, device_limits=H100) == plan
        monkeypatch.delenv("MPGEMM_GEMM_PATH")
    forced, batch, ping_pong, a100 = forced_plans(monkeypatch, m, n, k)
    wide = tile == "wgmma"
    assert [p.stream_k_blocks for p in (forced, batch, ping_pong, a100)] == [blocks if wide else 0, 0, 0, 0]
    if blocks is not None and not wide:
        monkeypatch.setenv("MPGEMM_NARROW_TILES", "0")
        assert mpgemm.gemm_plan(m, n, k, device_limits=H100).stream_k_blocks == 0
        # The other narrow tile forced: whole K on it.
        monkeypatch.setenv("MPGEMM_NARROW_TILES", "1")
        monkeypatch.setenv("MPGEMM_GEMM_PATH", "wgmma_n64" if tile == "wgmma_n128" else "wgmma_n128")
        assert mpgemm.gemm_plan(m, n, k, device_limits=H100).stream_k_blocks == 0


def test_stream_k_blocks_follow_the_multiprocessors(monkeypatch):
    """The blocks are the device's multiprocessors, fewer where the slices
    would give a block under 4; slices too few for two runs of 4 stay whole."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.setenv("MPGEMM_STREAM_K", "1")
    h100_pcie = dict(H100, multiprocessors=114)
    assert mpgemm.gemm_plan(768, 768, 16384, device_limits=h100_pcie).stream_k_blocks == 114
    # One tile of 24 slices on 11 multiprocessors: 6 runs of 4; of 8 slices, 2.
    assert mpgemm.gemm_plan(128, 256, 24 * 64, device_limits=dict(H100, multiprocessors=11)).stream_k_blocks == 6
    assert mpgemm.gemm_plan(128, 256, 8 * 64, device_limits=H100).stream_k_blocks == 2
    assert mpgemm.gemm_plan(128, 256, 7 * 64, device_limits=H100).stream_k_blocks == 0


def test_stream_k_is_a_tuning_candidate_and_a_tuned_entry_only_when_switched_on(monkeypatch):
    """With MPGEMM_STREAM_K=1 the heuristic's stream-K plan is among the
    tuner's candidates beside whole K on the same tile, and a tuned entry
    that ran stream-K plans it again (on this device's blocks); switched
    off, neither."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K", raising=False)

    def wide_plans():
        return sorted(p.stream_k_blocks for p in mpgemm.plan.candidate_plans(768, 768, 16384, device_limits=H100)
                      if p.config == "wgmma" and p.split_k == 1)

    monkeypatch.delenv("MPGEMM_STREAM_K", raising=False)
    assert wide_plans() == [0]
    gemm_plans.install_tuning([{"batch": 1, "m": 768, "n": 768, "k": 16384, "config": "wgmma", "split_k": 1,
                                "stream_k": True}])
    assert not mpgemm.gemm_plan(768, 768, 16384, device_limits=H100).tuned  # refused: switched off
    monkeypatch.setenv("MPGEMM_STREAM_K", "1")
    assert wide_plans() == [0, 132]
    plan = mpgemm.gemm_plan(768, 768, 16384, device_limits=dict(H100, multiprocessors=114))
    assert (plan.config, plan.stream_k_blocks, plan.tuned) == ("wgmma", 114, True)
    # An entry that timed whole K keeps whole K, switched on or not.
    gemm_plans.install_tuning([{"batch": 1, "m": 768, "n": 768, "k": 16384, "config": "wgmma", "split_k": 1}])
    assert mpgemm.gemm_plan(768, 768, 16384, device_limits=H100).stream_k_blocks == 0
    refused = "stream_k: runs on 'wgmma', 'wgmma_n128' or 'wgmma_n64' with split_k 1, got '{}' with {}"
    with pytest.raises(ValueError, match=refused.format("wgmma", 2)):
        gemm_plans._C.set_tuned_gemm_plan(1, 768, 768, 16384, "wgmma", 2, True)
    with pytest.raises(ValueError, match=refused.format("wgmma_pingpong", 1)):
        gemm_plans._C.set_tuned_gemm_plan(1, 768, 768, 16384, "wgmma_pingpong", 1, True)
    # An entry on a narrow tile runs stream-K on its own tile's blocks (7 x 64 slices of 128 x 64: 112 blocks).
    gemm_plans.install_tuning([{"batch": 1, "m": 896, "n": 64, "k": 4096, "config": "wgmma_n64", "split_k": 1,
                                "stream_k": True}])
    plan = mpgemm.gemm_plan(896, 64, 4096, device_limits=H100)
    assert (plan.config, plan.stream_k_blocks, plan.tuned) == ("wgmma_n64", 112, True)
    assert plan.workspace_bytes == 112 * 128 * 64 * 4 + 112 * 2 * 4


def test_a_bad_stream_k_switch_is_named(monkeypatch):
    monkeypatch.setenv("MPGEMM_STREAM_K", "yes")
    with pytest.raises(ValueError, match="MPGEMM_STREAM_K must be '0' or '1', got 'yes'"):
        mpgemm.gemm_plan(64, 64, 64, device_limits=A100)


@pytest.mark.parametrize("m, n, k, batch, pays", [
    (4095, 4097, 4093, 1, True), (1023, 1025, 1021, 1, False), (1400, 1400, 1400, 1, True),
    (1392, 1392, 1392, 1, False), (63, 65, 61, 1, False), (2047, 2049, 2045, 2, True)])
def test_padded_operands_take_the_hopper_path_where_the_copies_pay(m, n, k, batch, pays, monkeypatch):
    """MPGEMM_PADDED_OPERANDS=1 (opt-in until its GPU run): operands the
    copy engine cannot describe (a load width below 8) take the Hopper
    kernels on copies at aligned pitches where the product does at least
    350 FLOP per byte the copies read and write (both operands counted:
    2 m n k >= 350 x 4 (m k + k n) per matrix), or where a Hopper kernel is
    forced; its workspace holds both copies, rows and columns rounded up to 8;
    never on other archs, never switched off."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    assert (2 * m * n * k >= 350 * 4 * (m * k + k * n)) == pays
    def round_up(value, multiple):
        return -(-value // multiple) * multiple

    # Each copy: the batch of its matrices, rows and columns rounded up to 8, 2 bytes each, rounded up to 256 bytes.
    copies = sum(round_up(batch * round_up(rows, 8) * round_up(cols, 8) * 2, 256) for rows, cols in ((m, k), (k, n)))
    for switch in (None, "0"):
        set_environment(monkeypatch, "MPGEMM_PADDED_OPERANDS", switch)
        plan = mpgemm.gemm_plan(m, n, k, batch=batch, load_width=1, device_limits=H100)
        assert (plan.config, plan.padded_operands, plan.load_width) == ("scalar", False, 1)
    monkeypatch.setenv("MPGEMM_PADDED_OPERANDS", "1")
    plan = mpgemm.gemm_plan(m, n, k, batch=batch, load_width=1, device_limits=H100)
    if pays:
        assert plan.config.startswith("wgmma") and plan.padded_operands and plan.load_width == 8, plan
        assert plan.workspace_bytes == copies + (plan.split_k > 1) * plan.split_k * m * n * 4
    else:
        assert (plan.config, plan.padded_operands) == ("scalar", False)
    monkeypatch.setenv("MPGEMM_GEMM_PATH", "wgmma")
    forced = mpgemm.gemm_plan(m, n, k, batch=batch, load_width=2, device_limits=H100)
    assert (forced.config, forced.padded_operands) == ("wgmma", True)
    assert not mpgemm.gemm_plan(m, n, k, batch=batch, load_width=1, device_limits=A100).padded_operands
    # Operands the copy engine describes as they lie are never copied.
    assert not mpgemm.gemm_plan(m, n, k, batch=batch, load_width=8, device_limits=H100).padded_operands
    # A tuned Hopper entry (timed on operands read as they lie) holds only where nothing is copied.
    monkeypatch.delenv("MPGEMM_GEMM_PATH")
    gemm_plans.install_tuning([{"batch": batch, "m": m, "n": n, "k": k, "config": "wgmma", "split_k": 1}])
    assert not mpgemm.gemm_plan(m, n, k, batch=batch, load_width=1, device_limits=H100).tuned
    assert mpgemm.gemm_plan(m, n, k, batch=batch, load_width=8, device_limits=H100).tuned


def test_a_bad_padding_switch_is_named(monkeypatch):
    monkeypatch.setenv("MPGEMM_PADDED_OPERANDS", "2")
    with pytest.raises(ValueError, match="MPGEMM_PADDED_OPERANDS must be '0' or '1', got '2'"):
        mpgemm.gemm_plan(64, 64, 64, device_limits=A100)
