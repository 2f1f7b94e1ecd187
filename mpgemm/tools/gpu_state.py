"""The GPU's clocks, power and temperature, read through NVML (the
nvidia-ml-py package, `pynvml`) around timings: a number taken while the
card throttled says so. Where NVML cannot be read the reading says why, and
the tools run on."""

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
    """(the initialised pynvml module, None) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml (the nvidia-ml-py package) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver, or NVML refuses
        return None, f"NVML did not start: {type(e).__name__}: {e}"
    return pynvml, None


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
    nvml, _ = _nvml()
    if nvml is None:
        return None
    version = nvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else version


def throttle_reasons(mask):
    """The names of the set bits, idle left out (idle is not a slowdown under load)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit and bit != 0x1]


def read(device=None):
    """{sm_clock_mhz, memory_clock_mhz, max_sm_clock_mhz, power_w, power_limit_w,
    temperature_c, throttle_reasons} now; {error} where they cannot be read;
    None without a GPU."""
    if not torch.cuda.is_available():
        return None
    nvml, why_not = _nvml()
    if nvml is None:
        return {"error": why_not}
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


def describe(reading):
    """One reading in words."""
    if reading is None:
        return "no GPU"
    if "error" in reading:
        return f"not read ({reading['error']})"
    text = (f"SM {reading['sm_clock_mhz']}/{reading['max_sm_clock_mhz']} MHz, {reading['power_w']:.0f} of "
            f"{reading['power_limit_w']:.0f} W, {reading['temperature_c']} C")
    reasons = reading["throttle_reasons"]
    return text + (f", slowed by {', '.join(reasons)}" if reasons else ", not throttled")
