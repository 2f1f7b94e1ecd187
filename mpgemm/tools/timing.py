"""The one timing helper of mpgemm's benchmarks.

`time_interleaved` times several implementations of one computation in the
same run, so that their ratio means something:

- Device time only. Events recorded around a call launched on an idle GPU
  also time the host's launch of it (tens of microseconds: harmless at
  4096^3, most of the number at 1024^3). So each round first enqueues a spin
  on the device (`Clock.hold`) that outlasts the host's launching of the
  round; every call then waits in the queue behind it, and the events between
  calls read device work alone. After the round the helper checks that the
  spin was still running when the last call was queued; if not, the round is
  run again with a longer spin, and a round that never passes is counted in
  `Timing.starved_rounds`.
- Interleaved: every round runs each impl once, round r starting at impl
  r mod n, so that clock or thermal drift during the run falls on every
  implementation alike.
- The same predecessor for every call: before each call the clock runs a
  separator (`Clock.separate`) outside the timed interval, a read of a
  buffer twice the size of L2. In a rotation each impl would otherwise
  follow the same one in every round but the one it starts (the default
  path its cuDNN peer, say), and what that one leaves (L2 full of its dirty
  output, or of lines the next call's output reuses; another shared memory
  carveout) lands on the next call: two paths running the same kernels
  differed by up to 8 us on ResNet-50's small convolutions (H100, 2d75062;
  H200, fe39419; bench/NOTES.md). After the read, L2 holds clean lines that
  no operand shares and the multiprocessors come from the same small
  kernel, whichever impl is next, as a layer in training starts after
  another kernel that read or wrote an activation.
- Past the cache: call i (counting every call of every impl) reads input set
  i mod len(input_sets), so no call finds the operands of the one before it in
  L2 (`input_sets_for` sizes the rotation).
- Warmed up by time, not by count: whole rounds until `warmup_ms` have
  passed, so that clocks ramp up and lazy initialisation (cuBLAS handles,
  autotuning, first-call allocations) is done whatever the problem size.
"""

import dataclasses
import statistics
import time

import torch

MAX_ROUND_RETRIES = 3
# A spin covers twice the host's launch time of a round, plus this margin for
# a host thread descheduled now and then; never more than MAX_HOLD_MS, which
# only an impl that makes the host wait on the device (a sync) would need,
# and no spin can help that one.
HOLD_MARGIN_MS = 0.2
MAX_HOLD_MS = 50.0
# The separator's buffer where a device does not report its L2's size.
SWEEP_BYTES_UNKNOWN_L2 = 256 * 2**20


@dataclasses.dataclass
class Timing:
    times_ms: list
    starved_rounds: int = 0  # rounds whose device may have waited on the host

    @property
    def median_ms(self):
        return statistics.median(self.times_ms)


class CudaEventClock:
    """Device time on the current CUDA stream, between CUDA events."""

    asynchronous = True

    def __init__(self):
        self._cycles_per_ms = None
        self._l2_sweeps = {}  # separate()'s buffer on each device, made at its first call there

    def now(self):
        return 1000 * time.perf_counter()

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def reached(self, mark):
        return mark.query()

    def synchronize(self):
        torch.cuda.synchronize()

    def separate(self):
        """Enqueues on the current device a read of a buffer twice its L2's
        size, which writes back and evicts whatever the call before left
        there (module docstring)."""
        device = torch.cuda.current_device()
        if device not in self._l2_sweeps:
            # A device that reports no L2 size gets one past any current GPU's (H100, H200: 50 and 60 MB).
            l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size or SWEEP_BYTES_UNKNOWN_L2 // 2
            self._l2_sweeps[device] = torch.zeros(2 * l2_bytes // 4, dtype=torch.float32, device=device)
        self._l2_sweeps[device].amax()

    def hold(self, ms):
        """Enqueues a spin of about `ms` on the device."""
        if self._cycles_per_ms is None:
            self._cycles_per_ms = self._calibrate()
        torch.cuda._sleep(max(1, int(ms * self._cycles_per_ms)))

    def _calibrate(self, cycles=1_000_000):
        """Spin cycles per millisecond at the clock the GPU runs now."""
        rates = []
        for _ in range(3):
            start = self.mark()
            torch.cuda._sleep(cycles)
            end = self.mark()
            end.synchronize()
            rates.append(cycles / max(start.elapsed_time(end), 1e-3))
        return statistics.median(rates)


class WallClock:
    """Host time, for the CPU backend (every call is synchronous)."""

    asynchronous = False

    def now(self):
        return 1000 * time.perf_counter()

    def mark(self):
        return self.now()

    def elapsed_ms(self, start, end):
        return end - start

    def reached(self, mark):
        return True

    def synchronize(self):
        pass

    def separate(self):
        pass

    def hold(self, ms):
        pass


def input_sets_for(bytes_per_set, cache_bytes, max_sets=16):
    """How many input sets to rotate through so that together they exceed
    twice the cache, and each call reads operands the previous ones evicted."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-2 * cache_bytes // bytes_per_set)))


def _launch_round(fns, input_sets, first_call, clock):
    """Each fn on its input set after the clock's separator, between two
    marks; returns the (begin, end) marks of each call and the host time the
    launches took."""
    start = clock.now()
    intervals = []
    for i, fn in enumerate(fns):
        clock.separate()
        begin = clock.mark()
        fn(*input_sets[(first_call + i) % len(input_sets)])
        intervals.append((begin, clock.mark()))
    return intervals, clock.now() - start


def time_interleaved(impls, input_sets, *, clock, warmup_ms=100.0, reps=20):
    """Times each of `impls` (name -> fn) on `reps` rounds; returns name -> Timing.

    fn(*input_sets[j]) is one call; see the module docstring for how the
    rounds are laid out."""
    if reps < 1:
        raise ValueError("time_interleaved: reps must be at least 1")
    if not impls or not input_sets:
        raise ValueError("time_interleaved: needs at least one impl and one input set")
    names, fns = list(impls), list(impls.values())
    calls = 0
    launch_ms = 0.0
    start = clock.now()
    while True:
        _, launch_ms = _launch_round(fns, input_sets, calls, clock)
        calls += len(fns)
        clock.synchronize()
        if clock.now() - start >= warmup_ms:
            break

    times = {name: [] for name in names}
    starved = 0
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        hold_ms = min(2 * launch_ms + HOLD_MARGIN_MS, MAX_HOLD_MS)
        for attempt in range(MAX_ROUND_RETRIES + 1):
            clock.hold(hold_ms)
            held = clock.mark()
            intervals, round_launch_ms = _launch_round([impls[name] for name in order], input_sets, calls, clock)
            calls += len(order)
            kept_full = not clock.asynchronous or not clock.reached(held)
            clock.synchronize()
            if kept_full:
                # Only a round that kept the queue full says what launching costs:
                # in another the host may have waited on the device.
                launch_ms = round_launch_ms
                break
            if hold_ms >= MAX_HOLD_MS:
                break
            hold_ms = min(2 * hold_ms, MAX_HOLD_MS)
        starved += not kept_full
        for name, (begin, end) in zip(order, intervals):
            times[name].append(clock.elapsed_ms(begin, end))
    return {name: Timing(times[name], starved) for name in names}


def profiled_kernel_ms(fn, input_sets, reps=5):
    """The summed duration of the CUDA kernels fn runs per call, as
    torch.profiler (CUPTI) records them, averaged over `reps` calls on the
    rotated input sets: a reading independent of the events that
    `time_interleaved` uses."""
    from torch.profiler import ProfilerActivity, profile

    fn(*input_sets[0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            fn(*input_sets[(i + 1) % len(input_sets)])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / 1000 / reps
