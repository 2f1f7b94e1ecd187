"""The one timing helper of mpgemm's benchmarks.

A measurement warms up, then times `reps` calls one by one, rotating through
several input sets so that repeated calls do not find their operands in L2,
and reports every raw time with the median."""

import dataclasses
import statistics
import time

import torch


@dataclasses.dataclass
class Timing:
    times_ms: list

    @property
    def median_ms(self):
        return statistics.median(self.times_ms)


class CudaEventClock:
    """Times GPU work on the current stream with CUDA events."""

    def measure(self, fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


class WallClock:
    """Times CPU work with perf_counter."""

    def measure(self, fn):
        start = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - start)


def input_sets_for(bytes_per_set, cache_bytes, max_sets=16):
    """How many input sets to rotate through so that together they exceed
    twice the cache, and each call reads operands the previous ones evicted."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-2 * cache_bytes // bytes_per_set)))


def time_op(fn, input_sets, *, clock, warmup=5, reps=20):
    """Times fn(*inputs) over `reps` calls after `warmup` untimed ones; call i
    takes input_sets[i % len(input_sets)]."""
    if reps < 1:
        raise ValueError("time_op: reps must be at least 1")
    n = len(input_sets)
    for i in range(warmup):
        fn(*input_sets[i % n])
    times = []
    for i in range(reps):
        inputs = input_sets[(warmup + i) % n]
        times.append(clock.measure(lambda: fn(*inputs)))
    return Timing(times)
