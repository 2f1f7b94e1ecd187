"""step_profile.py on made-up traces: each device event is placed by when
the host launched it, the kinds and the idle time add up to the step, and
the kernels that take the most time come first."""

import pytest

from mpgemm.tools import step_profile


def _annotation(name, ts, dur):
    return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def _launch(correlation, ts):
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "args": {"correlation": correlation}}


def _kernel(name, correlation, ts, dur, cat="kernel"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": correlation}}


def _step(start):
    """A step of 1000 us: forward launches an mpgemm GEMM and a LayerNorm,
    backward a cuBLAS GEMM (queued in the forward's time, run later: placed
    by its launch) and a copy, the optimizer an elementwise kernel; 300 us of
    the step no device event covers."""
    c = start  # correlation ids unique per step
    return [
        _annotation("train_step", start, 1000),
        _annotation("train_step/forward", start, 300),
        _annotation("train_step/backward", start + 300, 400),
        _annotation("train_step/optimizer", start + 700, 250),
        _launch(c + 1, start + 10), _kernel("void mpgemm::kernels::gemm_kernel<128>(Params)", c + 1, start + 20, 200),
        _launch(c + 2, start + 20), _kernel("vectorized_layer_norm_kernel", c + 2, start + 220, 50),
        _launch(c + 3, start + 310), _kernel("nvjet_hsh_256x128_2cta", c + 3, start + 300, 200),
        _launch(c + 4, start + 320), _kernel("Memcpy DtoD", c + 4, start + 500, 100, cat="gpu_memcpy"),
        _launch(c + 5, start + 710), _kernel("multi_tensor_apply_kernel<SGD>", c + 5, start + 750, 150),
    ]


def test_device_events_are_placed_by_their_launch_and_add_up_to_the_step():
    events = _step(0) + _step(5000)
    # A kernel launched outside any step is not counted.
    events += [_launch(99, 9000), _kernel("elementwise_kernel", 99, 9010, 50)]
    summary = step_profile.summarize_trace(events)
    assert summary["steps"] == 2 and summary["step_ms"] == pytest.approx(1.0)
    assert summary["device_events"] == 10
    kinds = summary["categories_ms"]
    assert kinds == pytest.approx({"mpgemm": 0.2, "cudnn/cublas": 0.2, "attention": 0.0, "normalization": 0.05,
                                   "elementwise": 0.0, "optimizer": 0.15, "copies and fills": 0.1, "other": 0.0,
                                   "idle": 0.3})
    assert sum(kinds.values()) == pytest.approx(summary["step_ms"])
    assert summary["phases_ms"] == pytest.approx({"forward": 0.25, "backward": 0.3, "optimizer": 0.15})
    # The GEMMs alone: the LayerNorm, the copy and the optimizer's kernel are no products.
    assert summary["products_ms"] == pytest.approx({"forward": 0.2, "backward": 0.2})
    top = summary["top_kernels"]
    assert [k["category"] for k in top[:2]] == ["mpgemm", "cudnn/cublas"]
    assert top[0]["calls_per_step"] == 1 and top[0]["share"] == pytest.approx(0.2)
    lines = step_profile.format_profile({"model": "m", "batch_size": 2, "way": "mpgemm", "summary": summary})
    assert lines[0] == "m batch 2, mpgemm: 1.0 ms per step (mean of 2 profiled steps)"
    assert "idle 0.3 (30%)" in lines[1]
    assert lines[3] == "  convolution and GEMM kernels by phase: forward 0.2 ms, backward 0.2 ms"
    assert "mpgemm::kernels::gemm_kernel<128>" in lines[5]
    # A summary saved before the products were counted still formats.
    del summary["products_ms"]
    assert "mpgemm::kernels::gemm_kernel<128>" in step_profile.format_profile(
        {"model": "m", "batch_size": 2, "way": "mpgemm", "summary": summary})[4]


def test_a_summary_keeps_more_kernels_than_it_prints():
    """A prediction may name a small kernel (the statistics' totals): the
    summary keeps KEPT_KERNELS of them by time, the table prints TOP_KERNELS."""
    count = step_profile.KEPT_KERNELS + 5
    events = [_annotation("train_step", 0, 10_000), _annotation("train_step/forward", 0, 10_000)]
    for i in range(count):
        events += [_launch(i, 10 * i), _kernel(f"mpgemm::kernels::k{i}_kernel", i, 10 * i + 1, 1 + i)]
    summary = step_profile.summarize_trace(events)
    kept = summary["top_kernels"]
    assert len(kept) == step_profile.KEPT_KERNELS > step_profile.TOP_KERNELS
    assert [k["name"] for k in kept] == [f"mpgemm::kernels::k{i}_kernel" for i in reversed(range(5, count))]
    lines = step_profile.format_profile({"model": "m", "batch_size": 2, "way": "mpgemm", "summary": summary})
    table = [line for line in lines if "_kernel" in line]
    assert len(table) == step_profile.TOP_KERNELS and f"k{count - 1}_kernel" in table[0]


def test_a_trace_without_steps_or_device_events():
    assert step_profile.summarize_trace([_launch(1, 0), _kernel("k", 1, 0, 5)]) is None
    summary = step_profile.summarize_trace([_annotation("train_step", 0, 100)])
    assert summary["device_events"] == 0 and summary["categories_ms"]["idle"] == pytest.approx(0.1)
    lines = step_profile.format_profile({"model": "m", "batch_size": 2, "way": "fp32", "summary": summary})
    assert "no device events recorded" in lines[-1]
    assert step_profile.format_profile({"model": "m", "batch_size": 2, "way": "fp32", "summary": None,
                                        "reason": "OutOfMemoryError: x"}) == ["m batch 2, fp32: OutOfMemoryError: x"]


@pytest.mark.parametrize("name, phase, kind, expected", [
    ("void mpgemm::kernels::wgmma_conv_kernel<...>", "forward", "kernel", "mpgemm"),
    ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", "forward", "kernel", "cudnn/cublas"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "forward", "kernel", "attention"),
    ("pytorch_flash::flash_bwd_kernel", "backward", "kernel", "attention"),
    ("batch_norm_collect_statistics_channels_last_kernel", "forward", "kernel", "normalization"),
    ("void cudnn::batchnorm_bwtr_nhwc_semiPersist<__half, float>(cudnn::NhwcBatchNormBwdParams)", "backward",
     "kernel", "normalization"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float>(long)", "backward", "kernel",
     "normalization"),
    ("nvjet_sm90_hsh_192x192_64x4_1x2_h_bz_coopB_bias_TNN", "forward", "kernel", "cudnn/cublas"),
    ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", "backward", "kernel", "elementwise"),
    ("void mpgemm::kernels::unscale_kernel", "optimizer", "kernel", "optimizer"),
    ("Memset (Device)", "backward", "memset", "copies and fills"),
    ("some_custom_kernel", None, "kernel", "other"),
    # torch's channels_last pooling is no cuDNN kernel, whatever its name ends with.
    ("void at::native::(anonymous namespace)::max_pool_backward_nhwc<c10::Half, float>(c10::Half const*)",
     "backward", "kernel", "elementwise"),
])
def test_categories(name, phase, kind, expected):
    assert step_profile.category(name, phase, kind) == expected


@pytest.mark.parametrize("name, product", [
    ("void mpgemm::kernels::sm90::wgmma_conv_kernel<__half, mpgemm::kernels::WgmmaTile, "
     "(mpgemm::kernels::ConvPass)2>(CUtensorMap_st)", True),
    ("void mpgemm::kernels::sm90::wgmma_fprop_moments_kernel<__half, WgmmaTile>(CUtensorMap_st)", True),
    ("mpgemm::kernels::(anonymous namespace)::fold_input_kernel(mpgemm::kernels::Fold)", True),
    ("void mpgemm::kernels::splitk_reduce_kernel(float*)", True),
    ("sm90_xmma_dgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", True),
    ("nvjet_sm90_hsh_128x128_64x6_2x1_v_bz_splitK_NTT", True),
    # cuBLAS's and cuDNN's kernels whose own names do not say what they compute, and their helpers.
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8>(Params)", True),
    ("void xmma_cudnn::gemm::kernel<xmma_cudnn::implicit_gemm::fprop::Kernel_traits<>>(Params)", True),
    ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16>(Params)", True),
    ("void cask__5x_cudnn::computeOffsetsKernel<false, false>(cask__5x_cudnn::ComputeOffsetsParams)", True),
    ("void nchwToNhwcKernel<__half, __half, float, false, true>(int, int, int, int, __half const*)", True),
    ("void mpgemm::kernels::row_sums_reduce_kernel(float*, float const*, long, int)", True),
    # Batch norm's and the statistics' kernels sit in mpgemm's namespace but compute no product.
    ("void mpgemm::kernels::batch_norm::sums_kernel<__half, 8>(mpgemm::kernels::batch_norm::SumsArgs)", False),
    ("void mpgemm::kernels::(anonymous namespace)::moments_split_kernel(TotalArgs)", False),
    ("void mpgemm::kernels::(anonymous namespace)::moments_total_kernel(TotalArgs)", False),
    ("void mpgemm::kernels::gated_kernel<__half>(GatedArgs)", False),
    ("void cudnn::batchnorm_fwtr_nhwc_semiPersist<__half, float>(cudnn::NhwcBatchNormFwdParams)", False),
    ("void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::Half, int>(c10::Half const*)", False),
])
def test_products_are_the_convolution_and_gemm_kernels(name, product):
    label = step_profile.category(name, "forward")
    assert step_profile.is_product(name, label) is product


def test_short_names_drop_parameters_not_template_arguments():
    assert step_profile.short_name("void f<g(int)>(float*, int)") == "f<g(int)>"
    assert step_profile.short_name("void at::native::(anonymous namespace)::k<float>(long)") == "at::native::k<float>"
    assert len(step_profile.short_name("k" * 200, 60)) == 60
