"""The GPU's clocks, power and temperature, read through NVML (the
nvidia-ml-py package, `pynvml`) around timings: a number taken while the
card throttled says so. Everything here returns None where NVML is missing,
so the tools run the same without it."""

import torch

# nvmlClocksEventReasons bits (nvml.h), those that lower the SM clock.
THROTTLE_REASONS = {
    0x1: "gpu idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, no driver, or NVML refuses: no readings
        return None


def _handle(nvml, device):
    """NVML's handle for a torch CUDA device (NVML numbers GPUs by PCI bus,
    torch by CUDA_VISIBLE_DEVICES; the UUID ties the two)."""
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    for prefix in ("GPU-", ""):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(prefix + uuid)
        except Exception:
            continue
    return nvml.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)


def driver_version():
    nvml = _nvml()
    if nvml is None:
        return None
    version = nvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else version


def throttle_reasons(mask):
    """The names of the set bits, idle left out (idle is not a slowdown under load)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit and bit != 0x1]


def read(device=None):
    """{sm_clock_mhz, memory_clock_mhz, max_sm_clock_mhz, power_w, power_limit_w,
    temperature_c, throttle_reasons} now, or None without NVML."""
    nvml = _nvml()
    if nvml is None or not torch.cuda.is_available():
        return None
    try:
        h = _handle(nvml, device if device is not None else torch.cuda.current_device())
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return {
            "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "memory_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
            "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "throttle_reasons": throttle_reasons(reasons(h)),
        }
    except Exception as e:  # a reading NVML refuses on this card is reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"}
