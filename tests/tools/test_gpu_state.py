"""GPU readings through NVML, on a fake pynvml (no GPU here), and nothing at
all where NVML is missing."""

import sys
import types

import pytest
import torch

from mpgemm.tools import gpu_state


def fake_nvml(reasons=0x4 | 0x1, fail_on=None):
    nvml = types.SimpleNamespace(NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0)
    nvml.handles = {}

    def call(name, value):
        def fn(*args):
            if name == fail_on:
                raise RuntimeError("not supported")
            return value(*args) if callable(value) else value

        return fn

    nvml.nvmlInit = call("init", None)
    nvml.nvmlSystemGetDriverVersion = call("driver", b"580.159.04")
    nvml.nvmlDeviceGetHandleByUUID = call("uuid", lambda uuid: ("handle", uuid))
    nvml.nvmlDeviceGetClockInfo = call("clock", lambda h, kind: {0: 1755, 1: 2619}[kind])
    nvml.nvmlDeviceGetMaxClockInfo = call("max", lambda h, kind: 1980)
    nvml.nvmlDeviceGetPowerUsage = call("power", 412_500)
    nvml.nvmlDeviceGetEnforcedPowerLimit = call("limit", 700_000)
    nvml.nvmlDeviceGetTemperature = call("temp", lambda h, kind: 47)
    nvml.nvmlDeviceGetCurrentClocksEventReasons = call("reasons", lambda h: reasons)
    return nvml


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid="abc-123"))


def test_readings_with_units_and_throttle_reasons(monkeypatch, gpu):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert gpu_state.read() == {
        "sm_clock_mhz": 1755, "memory_clock_mhz": 2619, "max_sm_clock_mhz": 1980, "power_w": 412.5,
        "power_limit_w": 700.0, "temperature_c": 47, "throttle_reasons": ["software power cap"]}
    assert gpu_state.driver_version() == "580.159.04"


def test_a_refused_reading_is_reported_not_raised(monkeypatch, gpu):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail_on="power"))
    assert gpu_state.read() == {"error": "RuntimeError: not supported"}


def test_without_nvml_the_reading_says_why(monkeypatch, gpu):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_state.read() == {"error": "pynvml (the nvidia-ml-py package) is not installed"}
    assert gpu_state.driver_version() is None
    assert gpu_state.describe(gpu_state.read()) == "not read (pynvml (the nvidia-ml-py package) is not installed)"


def test_no_reading_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_state.read() is None and gpu_state.describe(None) == "no GPU"


def test_a_reading_in_words(monkeypatch, gpu):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert gpu_state.describe(gpu_state.read()) == "SM 1755/1980 MHz, 412 of 700 W, 47 C, slowed by software power cap"


def test_throttle_reasons_leave_idle_out():
    assert gpu_state.throttle_reasons(0x1) == []
    assert gpu_state.throttle_reasons(0x40 | 0x8) == ["hardware slowdown", "hardware thermal slowdown"]
