"""The timing helper on a fake GPU: a device queue in simulated time, where the
host pays a dispatch cost per launch and the device runs work in order, each
piece no earlier than its launch. That is the situation the helper must not
be fooled by: events around a call on an idle GPU time the dispatch too."""

import math

import pytest

from mpgemm.tools import timing


class FakeGpu:
    asynchronous = True
    MARK_COST_MS = 0.001
    SEPARATOR_MS = 0.02  # the separator's device time; its dispatch costs a mark's

    def __init__(self, hold_factor=1.0, log=None):
        self.host = 0.0
        self.device_free = 0.0
        self.hold_factor = hold_factor  # < 1: a spin shorter than asked for
        self.holds = []
        self.log = log  # kernel() appends its calls here; separate() appends "separator"

    def launch(self, work_ms, dispatch_ms):
        self.host += dispatch_ms
        self.device_free = max(self.device_free, self.host) + work_ms

    def now(self):
        return self.host

    def mark(self):
        self.host += self.MARK_COST_MS
        self.device_free = max(self.device_free, self.host)
        return self.device_free

    def elapsed_ms(self, start, end):
        return end - start

    def reached(self, mark):
        return mark <= self.host

    def synchronize(self):
        self.host = max(self.host, self.device_free)

    def hold(self, ms):
        self.holds.append(ms)
        self.launch(ms * self.hold_factor, dispatch_ms=0.005)

    def separate(self):
        if self.log is not None:
            self.log.append(("separator", ()))
        self.launch(self.SEPARATOR_MS, dispatch_ms=self.MARK_COST_MS)


def kernel(gpu, work_ms, dispatch_ms, log=None, name=None):
    def run(*inputs):
        if log is not None:
            log.append((name, inputs))
        gpu.launch(work_ms, dispatch_ms)

    return run


def test_the_fake_gpu_shows_the_problem():
    gpu = FakeGpu()
    start = gpu.mark()
    kernel(gpu, work_ms=0.01, dispatch_ms=0.05)()
    end = gpu.mark()
    gpu.synchronize()
    assert gpu.elapsed_ms(start, end) > 0.05  # dispatch counted as kernel time


def test_device_time_excludes_host_dispatch():
    gpu = FakeGpu()
    impls = {"small": kernel(gpu, 0.01, dispatch_ms=0.05), "large": kernel(gpu, 0.3, dispatch_ms=0.05)}
    result = timing.time_interleaved(impls, [()], clock=gpu, warmup_ms=1.0, reps=7)
    assert result["small"].times_ms == pytest.approx([0.01] * 7)
    assert result["large"].times_ms == pytest.approx([0.3] * 7)
    assert result["small"].starved_rounds == 0 and result["small"].median_ms == pytest.approx(0.01)


def test_rounds_interleave_impls_and_rotate_inputs_across_every_call():
    log = []
    gpu = FakeGpu(log=log)
    impls = {name: kernel(gpu, 0.1, 0.01, log, name) for name in ("cublas", "mpgemm", "torch")}
    sets = [(i,) for i in range(4)]
    timing.time_interleaved(impls, sets, clock=gpu, warmup_ms=0.0, reps=5)
    rounds = [["cublas", "mpgemm", "torch"], ["mpgemm", "torch", "cublas"], ["torch", "cublas", "mpgemm"]]
    # One warm-up round, then 5 rounds, each starting at the next impl; the
    # separator before every call, so that no impl always follows the same one.
    calls = sum([rounds[0], *rounds, *rounds[:2]], [])
    assert [name for name, _ in log] == [name for call in calls for name in ("separator", call)]
    assert [inputs[0] for name, inputs in log if name != "separator"] == [i % 4 for i in range(18)]


class Leftover(FakeGpu):
    """A device where a call pays for what the work before it left behind
    (dirty lines in L2, another carveout) unless a separator came between:
    `cost[name]` is what the call after `name` pays."""

    def __init__(self, cost):
        super().__init__()
        self.cost, self.last = cost, None

    def run(self, name, work_ms):
        def call(*inputs):
            self.launch(work_ms + self.cost.get(self.last, 0.0), dispatch_ms=0.01)
            self.last = name

        return call

    def separate(self):
        super().separate()
        self.last = None


def test_no_impl_pays_for_the_impl_before_it():
    # "peer" leaves 0.05 ms of work to whatever runs next; "a" and "b" run the
    # same kernel. Without the separator "a" always followed "peer".
    gpu = Leftover({"peer": 0.05})
    impls = {"peer": gpu.run("peer", 0.2), "a": gpu.run("a", 0.1), "b": gpu.run("b", 0.1)}
    result = timing.time_interleaved(impls, [()], clock=gpu, warmup_ms=0.0, reps=6)
    assert result["a"].times_ms == pytest.approx([0.1] * 6) and result["b"].times_ms == pytest.approx([0.1] * 6)
    assert result["peer"].times_ms == pytest.approx([0.2] * 6)  # the separator's own time is not counted


@pytest.mark.parametrize("work_ms", [1.0, 7.0, 40.0])
def test_warm_up_lasts_a_time_not_a_count(work_ms):
    gpu, log = FakeGpu(), []
    impls = {"a": kernel(gpu, work_ms, 0.01, log, "a"), "b": kernel(gpu, work_ms, 0.01, log, "b")}
    timing.time_interleaved(impls, [()], clock=gpu, warmup_ms=100.0, reps=3)
    warmup_rounds = len(log) // 2 - 3
    # The device's time a round: each call's separator and its own work (the host's dispatches overlap them).
    round_ms = 2 * (work_ms + FakeGpu.SEPARATOR_MS) + FakeGpu.MARK_COST_MS
    assert warmup_rounds == math.ceil(100.0 / round_ms)


def test_a_short_spin_is_lengthened_and_the_round_run_again():
    gpu, log = FakeGpu(hold_factor=0.3), []
    impls = {"a": kernel(gpu, 0.001, 0.5, log, "a"), "b": kernel(gpu, 0.001, 0.5, log, "b")}
    result = timing.time_interleaved(impls, [()], clock=gpu, warmup_ms=0.0, reps=4)
    assert result["a"].times_ms == pytest.approx([0.001] * 4) and result["a"].starved_rounds == 0
    assert len(log) == 2 * (1 + 4 * 2)  # each round starved once, then passed with a doubled spin
    assert gpu.holds[1] == pytest.approx(2 * gpu.holds[0])


def test_an_impl_that_waits_on_the_device_does_not_grow_the_spin_without_bound():
    gpu = FakeGpu()

    def synchronizing(*inputs):
        gpu.launch(5.0, dispatch_ms=0.01)
        gpu.synchronize()  # .item(), a host copy, a sync

    result = timing.time_interleaved({"sync": synchronizing, "async": kernel(gpu, 1.0, 0.01)}, [()], clock=gpu,
                                     warmup_ms=0.0, reps=6)
    assert max(gpu.holds) == timing.MAX_HOLD_MS and result["sync"].starved_rounds == 6
    assert len(gpu.holds) <= 6 * (timing.MAX_ROUND_RETRIES + 1)


def test_rounds_the_spin_cannot_cover_are_counted():
    gpu = FakeGpu(hold_factor=0.0)
    result = timing.time_interleaved({"a": kernel(gpu, 0.001, 0.05)}, [()], clock=gpu, warmup_ms=0.0, reps=3)
    assert result["a"].starved_rounds == 3
    assert len(gpu.holds) == 3 * (timing.MAX_ROUND_RETRIES + 1)


def test_wall_clock_times_synchronous_calls():
    calls = []
    result = timing.time_interleaved({"f": lambda x: calls.append(x)}, [(1,), (2,)], clock=timing.WallClock(),
                                     warmup_ms=0.0, reps=3)
    assert calls == [1, 2, 1, 2] and len(result["f"].times_ms) == 3 and result["f"].starved_rounds == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="reps must be at least 1"):
        timing.time_interleaved({"f": lambda: None}, [()], clock=timing.WallClock(), reps=0)
    with pytest.raises(ValueError, match="at least one impl and one input set"):
        timing.time_interleaved({}, [()], clock=timing.WallClock())


def test_input_sets_exceed_the_cache():
    assert timing.input_sets_for(10 * 2**20, 50 * 2**20) == 10
    assert timing.input_sets_for(200 * 2**20, 50 * 2**20) == 1
    assert timing.input_sets_for(1, 50 * 2**20) == 16


@pytest.mark.gpu
def test_cuda_events_agree_with_the_profiler_on_a_real_gpu():
    # Also keeps the separator out of the interval: its read of twice L2
    # takes about as long as this product.
    import torch

    sets = [(torch.randn(2048, 2048, device="cuda").half(), torch.randn(2048, 2048, device="cuda").half())
            for _ in range(4)]
    result = timing.time_interleaved({"mm": torch.mm}, sets, clock=timing.CudaEventClock(), reps=10)["mm"]
    assert result.starved_rounds == 0
    kernel_ms = timing.profiled_kernel_ms(torch.mm, sets)
    assert abs(result.median_ms / kernel_ms - 1) < 0.15

