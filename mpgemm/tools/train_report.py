"""The text of `bench train`'s report, made from the report dict alone (the
JSON it writes), in at most display.REPORT_WIDTH columns.

On a GPU: throughput, ms/step, speedup over fp32, peak memory, the largest
workspace one mpgemm call took ("work MB") and skipped steps per model,
batch size and way, then the largest batches that fit. On
the CPU: ms/step and saved memory only, under a line saying that these are
not GPU measurements."""

from . import display, gpu_state, provenance, step_profile, training

UNIT_ABBREVIATIONS = {"images": "img/s", "tokens": "tok/s"}
CPU_WARNING = ("NOT GPU MEASUREMENTS: without a GPU, --quick trains a tiny configuration on mpgemm's CPU "
               "reference backend to show that the benchmark runs. No throughput or speedup is given; "
               "'CPU ms/step' are CPU times and 'saved MB' is what autograd saved for backward in one step.")


def _setup_text(report):
    c = report["config"]
    names = set(c["models"])
    parts = []
    if "resnet50" in names:
        parts.append(f"ResNet-50 (images) at 3x{c['image_size']}x{c['image_size']}, channels_last, cross-entropy on "
                     f"random labels")
    if "gpt2-block" in names:
        parts.append(f"a GPT-2 block (sequences of {c['seq_len']} tokens; width {c['d_model']}, pre-LayerNorm, "
                     f"causal SDPA, GELU MLP), MSE to a random target")
    if "llama-block" in names:
        parts.append(f"a Llama block (sequences of {c['seq_len']} tokens; width {c['d_model']}, RMSNorm, causal "
                     f"SDPA without rotary embedding, SwiGLU MLP of 8/3 the width), MSE to a random target")
    setup = "; ".join(parts)
    return (f"{setup[:1].upper()}{setup[1:]}. SGD lr {c['lr']} momentum 0.9, synthetic data on the device, "
            f"seed {c['seed']}. "
            f"Per run up to {c['max_warmup_steps']} warm-up steps (more while the loss scaler skips its first "
            f"steps) and {min(c.get('min_timed_steps', 0), c['max_timed_steps'])} to {c['max_timed_steps']} timed "
            f"steps, the median reported. fp32 "
            f"{'at every batch' if c.get('fp32_every_batch', True) else 'at the smallest batch only'}. "
            f"{report['settings']['fp32']}; {report['settings']['bf16']}; cudnn.benchmark "
            f"{'on' if report['settings']['cudnn_benchmark'] else 'off'}.")


def _megabytes(value):
    """A figure a report made before it was measured lacks: "-"."""
    return "-" if value is None else f"{value:.1f}"


def _runs_table(runs, on_gpu):
    header = (["model", "batch", "way", "throughput", "ms/step", "vs fp32", "vs amp", "peak MB", "work MB"]
              if on_gpu else ["model", "batch", "way", "CPU ms/step", "saved MB"]) + ["skipped"]
    # Names read left-aligned, numbers right-aligned.
    name_width = max([len(header[0])] + [len(r["model"]) for r in runs])
    way_width = max(map(len, training.ALL_WAYS))
    header[0], header[2] = header[0].ljust(name_width), header[2].ljust(way_width)
    rows = []
    for r in runs:
        row = [r["model"].ljust(name_width), str(r["batch_size"]), r["way"].ljust(way_width)]
        if r["status"] != "ok":
            rows.append(row + [r["status"]] + [""] * (len(header) - len(row) - 1))
            continue
        ms = f"{1000 * r['median_step_s']:.1f}"
        if on_gpu:
            speedup = f"{r['speedup_vs_fp32']:.2f}x" if r["speedup_vs_fp32"] else ""
            if speedup and r.get("fp32_batch") not in (None, r["batch_size"]):
                speedup += "*"
            vs_amp = f"{r['vs_torch_amp']:.2f}x" if r.get("vs_torch_amp") else ""
            if r.get("spread") is not None:
                ms += f" ±{50 * r['spread']:.0f}%"
            row += [f"{r['items_per_s']:.0f} {UNIT_ABBREVIATIONS[r['unit']]}", ms, speedup, vs_amp,
                    f"{r['peak_memory_mb']:.0f}", _megabytes(r.get("workspace_largest_mb"))]
        else:
            row += [ms, f"{r['saved_memory_mb']:.1f}"]
        rows.append(row + [f"{r['skipped_steps']}/{len(r['step_times_s'])}"])
    return display.format_table(header, rows, right_align=True)


def _search_text(search):
    head, unit = f"{search['model']} {search['way']}: ", search["batch_unit"]
    tries = ", ".join(f"{t['batch_size']} {'fits' if t['fits'] else 'error' if t['error'] else 'OOM'}"
                      for t in search["tries"])
    tries = f" Tries: {tries}." if tries else ""
    if search["status"] == "found":
        if search["largest_fitting"] is None:
            return head + f"no batch fits ({search['smallest_oom']} {unit} ran out of memory)."
        return head + f"{search['largest_fitting']} {unit} ({search['smallest_oom']} ran out of memory).{tries}"
    if search["status"] == "at least":
        below = f", fewer than {search['smallest_oom']}" if search["smallest_oom"] else ""
        return head + f"at least {search['largest_fitting']} {unit}{below}; stopped: {search['reason']}.{tries}"
    return head + f"{search['status']}: {search['reason'] or 'the time limit came before it'}.{tries}"


def format_report(report):
    on_gpu = report["provenance"]["gpu_measurement"]
    wrap = display.wrap
    lines = [wrap(provenance.headline(report["provenance"]))]
    if not on_gpu:
        lines.append(wrap(CPU_WARNING))
    lines.append(wrap(_setup_text(report)))
    if on_gpu:
        state = report["gpu_state"]
        lines.append(wrap(f"GPU before the timed runs: {gpu_state.describe(state['before'])}; after: "
                          f"{gpu_state.describe(state['after'])}."))
    lines.append(_runs_table(report["runs"], on_gpu))
    if on_gpu:
        lines.append(wrap("ms/step: the median timed step, ± half the spread (slowest - fastest) over the median; "
                          "vs fp32: throughput over fp32's at the same batch (* at the batch fp32 ran); vs amp: "
                          "mpgemm's throughput (or a captured way's) over torch.amp's eager one in the same type at "
                          "the same batch; skipped: of the timed steps."))
    for r in report["runs"]:
        if r["status"] != "ok":
            lines.append(wrap(f"{r['model']} batch {r['batch_size']} {r['way']}, {r['status']}: {r['reason']}",
                              indent="  "))
    searches = report["largest_batch"]
    if all(s["status"] == "skipped" for s in searches):
        lines.append(wrap(f"Largest-batch search skipped: {searches[0]['reason']}." if searches else ""))
    else:
        memory = f", {report['device_memory_mb']:.0f} MB device" if report["device_memory_mb"] else ""
        lines.append(f"Largest batch that fits (one forward+backward+step on a fresh model per try{memory}):")
        lines += [wrap(_search_text(s), indent="  ") for s in searches]
    if report.get("profiles"):
        lines.append("Profiled steps (torch.profiler; per step, device time):")
        for entry in report["profiles"]:
            lines += step_profile.format_profile(entry)
    measured = sum(r["status"] == "ok" for r in report["runs"])
    lines.append(f"Time limit {report['config']['time_limit_s']:.0f} s, used {report['elapsed_s']:.1f} s; "
                 f"{measured} of {len(report['runs'])} runs measured.")
    return "\n".join(lines)
