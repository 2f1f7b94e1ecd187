"""The ops on the current stream: on a side stream their results equal the
default stream's (and nothing they wrote is read before the side stream's
work is done), and two threads, each on its own stream, get the answers one
thread gets (skipped without a GPU)."""

import threading

import pytest
import torch

import mpgemm
from mpgemm.testing import random_operand
from support import SEED

pytestmark = pytest.mark.gpu


def make_inputs():
    """Fresh inputs, made once on the main thread (the generator is shared)."""
    torch.manual_seed(SEED)
    return {
        "a": random_operand((3, 96, 80), device="cuda"),
        "b": random_operand((80, 72), device="cuda"),
        "x": torch.randn(4, 50, 96, device="cuda", dtype=torch.float16),
        "w": torch.randn(40, 96, device="cuda", dtype=torch.float16),
        "image": torch.randn(2, 16, 12, 12, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last),
        "filters": torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.float16),
    }


def forward_and_backward(inputs):
    """gemm, linear and conv2d and their gradients, on the current stream."""
    x, w, image, filters = (inputs[k].detach().clone().requires_grad_() for k in ("x", "w", "image", "filters"))
    product = mpgemm.gemm(inputs["a"], inputs["b"], activation="gelu")
    y = mpgemm.linear(x, w, activation="relu")
    z = mpgemm.conv2d(image, filters, padding=1, stride=2)
    (y.float().sum() + z.float().square().sum()).backward()
    return [product, y, z, x.grad, w.grad, image.grad, filters.grad]


def test_results_on_a_side_stream_equal_the_default_streams():
    inputs = make_inputs()
    expected = forward_and_backward(inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = forward_and_backward(inputs)
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(e, g) for e, g in zip(expected, got))


def test_two_threads_on_their_own_streams_get_one_threads_answers():
    inputs = make_inputs()
    expected = forward_and_backward(inputs)
    torch.cuda.synchronize()  # the threads' streams read the inputs
    outcomes = [None, None]

    def run(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                results = [forward_and_backward(inputs) for _ in range(3)]
            stream.synchronize()
            outcomes[i] = results
        except Exception as error:  # noqa: BLE001 (handed to the main thread)
            outcomes[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for outcome in outcomes:
        assert not isinstance(outcome, Exception), outcome
        for results in outcome:
            assert all(torch.equal(e, g) for e, g in zip(expected, results))
