"""mpgemm's first call on a thread that has done no CUDA work before: the
autograd engine's device thread running a backward, or a user's worker
thread. The Hopper kernels' tensor maps are encoded by the driver, which
needs the device's context current on the calling thread, and a new thread
has none until some call makes it so (seen on an H100 at d816ee9: the
backward's first Hopper GEMM failed with "invalid argument"). Each op runs in
a new thread against a float64 reference (skipped without a GPU)."""

import threading

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import relative_error

pytestmark = pytest.mark.gpu

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def on_new_thread(fn):
    """fn() on a thread of its own: its result, or the error it raised."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
            torch.cuda.synchronize()
        except Exception as error:  # handed back to the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_gemm_on_a_new_thread():
    a = torch.randn(300, 200, device="cuda").half()
    b = torch.randn(200, 520, device="cuda").half()
    out = on_new_thread(lambda: mpgemm.gemm(a, b))
    assert relative_error(out, a.double() @ b.double()) < 1e-3


@pytest.mark.parametrize("x_shape, out_features", [((2, 3, 5, 40), 9), ((40,), 12), ((64, 64), 64)])
def test_linear_backward_runs_on_the_autograd_thread(x_shape, out_features):
    """The backward recomputes the pre-activation with a GEMM, on autograd's
    own thread, after a forward on the test's."""
    x = torch.randn(x_shape, device="cuda").half().requires_grad_()
    weight = (torch.randn(out_features, x_shape[-1], device="cuda") / x_shape[-1] ** 0.5).half().requires_grad_()
    bias = torch.randn(out_features, device="cuda").half().requires_grad_()
    grad = torch.randn(*x_shape[:-1], out_features, device="cuda").half()
    on_new_thread(lambda: mpgemm.linear(x, weight, bias, activation="relu").backward(grad))
    refs = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    F.relu(F.linear(*refs)).backward(grad.double())
    for t, ref in zip((x, weight, bias), refs):
        assert relative_error(t.grad, ref.grad) < 1e-2


@pytest.mark.parametrize("path", ["auto", pytest.param("wgmma", marks=pytest.mark.skipif(
    not IS_HOPPER, reason="the Hopper convolution needs an sm_90 GPU"))])
def test_conv2d_forward_and_backward_on_a_new_thread(monkeypatch, path):
    monkeypatch.setenv("MPGEMM_CONV_PATH", path)
    x = torch.randn(2, 64, 12, 12, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    weight = (torch.randn(128, 64, 3, 3, device="cuda") / 24).half().requires_grad_()
    grad = torch.randn(2, 128, 12, 12, device="cuda").half()

    def step():
        out = mpgemm.conv2d(x, weight, None, 1, 1)
        out.backward(grad)
        return out

    out = on_new_thread(step)
    refs = [t.detach().double().requires_grad_() for t in (x, weight)]
    ref = F.conv2d(*refs, None, 1, 1)
    ref.backward(grad.double())
    assert relative_error(out, ref) < 1e-2
    for t, r in zip((x, weight), refs):
        assert relative_error(t.grad, r.grad) < 1e-2
