"""What `python -m mpgemm bench` shows of a report: the text table, CSV and a plot.

A row whose result check failed shows FAIL and no speed; a CPU report shows
no comparison at all."""

import csv
import math

from . import display, gpu_state, provenance


def failed_checks(report):
    return [r for r in report["results"] if r["check_passed"] is False]


def _shape(r):
    return "x".join(map(str, r["shape"]))


# Events and the profiler's kernel time of one call should agree this well
# for a one-kernel call; more says the events time something else too.
CROSS_CHECK_TOLERANCE = 0.10


def cross_check_line(row):
    events, kernels = row["median_ms"], row["profiler_kernel_ms"]
    differs = abs(events / kernels - 1) if kernels > 0 else float("inf")
    verdict = "agree" if differs <= CROSS_CHECK_TOLERANCE else f"DIFFER by {100 * differs:.0f}%"
    return (f"timing cross-check, {row['impl']} at {_shape(row)}: events {events:.4f} ms, profiler kernel time "
            f"{kernels:.4f} ms: {verdict}")


def _gpu_state_lines(report):
    by_suite = {}
    for s in report.get("gpu_state", []):
        by_suite.setdefault(s["suite"], {})[s["when"]] = gpu_state.describe(s["reading"])
    return [f"GPU during {suite}: before {states.get('before', 'not read')}; after {states.get('after', 'not read')}"
            for suite, states in by_suite.items()]


def notes(report):
    """What the table cannot show: GPU state, failed checks and cases,
    rounds in which the GPU may have waited, the timing cross-check."""
    lines = _gpu_state_lines(report) if report["gpu_measurement"] else []
    for r in failed_checks(report):
        against = r["baseline"] or "its float64 reference"
        lines.append(f"FAIL: {r['impl']} at {_shape(r)} differs from {against} by a relative error of "
                     f"{r['check_error']:.3g} (bound {r['check_tolerance']:g}): no speed posted")
    for e in report.get("errors", []):
        lines.append(f"ERROR: {e['suite']} {e['dtype']} at {_shape(e)}: {e['error']}")
    lines += [f"{dtype} not run: {why}" for dtype, why in report.get("dtypes_not_run", {}).items()]
    for r in report["results"]:
        if r["starved_rounds"]:
            lines.append(f"note: {r['impl']} at {_shape(r)}: in {r['starved_rounds']} of {len(r['times_ms'])} rounds "
                         "the GPU may have waited for the host; that time is in its number")
    lines += [cross_check_line(r) for r in report["results"] if "profiler_kernel_ms" in r]
    return lines


def format_report(report):
    on_gpu = report["gpu_measurement"]
    lines = [provenance.headline(report)]
    if not on_gpu:
        lines.append("CPU reference backend: these are not GPU measurements, and no speed comparison is made.")
    else:
        peak = report["peak_tflops"]
        lines.append(f"peak {peak['value']:.1f} TFLOP/s ({peak['source']}); median of {report['timing']['reps']} "
                     f"interleaved rounds, device time")
    by_key = {(r["suite"], r["case"], _shape(r), r["impl"]): r for r in report["results"]}
    header = ["suite", "shape", "impl", "median ms", "TFLOP/s"]
    if on_gpu:
        header += ["vs base", "% peak"]
    header.append("check")
    rows = []
    for r in report["results"]:
        failed = r["check_passed"] is False
        tflops = "-" if r["tflops"] is None else f"{r['tflops']:.2f}"
        row = [r["suite"], _shape(r), r["impl"], "-" if failed else f"{r['median_ms']:.4f}", tflops]
        if on_gpu:
            base = by_key.get((r["suite"], r["case"], _shape(r), r["baseline"]))
            row.append(f"{base['median_ms'] / r['median_ms']:.2f}x" if base and not failed else "")
            row.append("" if r["tflops"] is None else f"{100 * r['tflops'] / report['peak_tflops']['value']:.1f}")
        row.append({None: "", True: "ok", False: "FAIL"}[r["check_passed"]])
        rows.append(row)
    lines.append(display.format_table(header, rows, rule=False))
    if on_gpu and conv_pass_rows(report):
        lines.append("conv, pass by pass: geomean of cuDNN's time over mpgemm's (above 1x: mpgemm faster); "
                     "cuDNN share: the class's part of cuDNN's fwd+bwd time over the suite; "
                     + conv_bias_note(report))
        lines += conv_pass_table(report)
    lines += notes(report)
    if not report.get("complete", True):
        lines.append("incomplete: the run stopped before its last case")
    return "\n".join(lines)


# The passes of the conv suite's impls: (impl name's ending, the pass's name).
CONV_PASS_ENDINGS = (("fwd", "fprop"), ("dgrad", "dgrad"), ("wgrad", "wgrad"), ("fwd+bwd", "fwd+bwd"))


def conv_bias_note(report):
    """Which of the conv suite's forwards add a bias: the layers that have
    one, from 2026-11-30 on (rows say "bias"); every layer before, which
    timed cuDNN's separate bias pass where the model runs none."""
    conv = [r for r in report["results"] if r["suite"] == "conv"]
    if any("bias" not in r for r in conv):
        return "fprop with a bias on every layer (cuDNN adds it in a pass of its own; a report from before 2026-11-30)"
    cases = sorted({r["case"] for r in conv if r["bias"]})
    return f"fprop as each model runs it: with a bias on {', '.join(cases)}'s layers only" if cases else \
        "fprop as each model runs it: no layer with a bias"


def conv_layer_class(shape):
    """What kind of convolution a conv case is, for the per-pass table: the
    first layer (3 channels), depthwise (a group a channel), grouped, 1x1 or
    RxS, strided or not; and narrow (at most 128 filters) or wide."""
    batch, c, k, kernel, stride, padding, size, *rest = shape
    if rest and rest[0] == c:
        return "depthwise"
    if rest and rest[0] > 1:
        return "grouped"
    if c == 3:
        return "first layer"
    geometry = f"{kernel}x{kernel}" + (" strided" if stride > 1 else "")
    return f"{geometry}, {'<=128' if k <= 128 else '>=256'} filters"


def conv_pass_rows(report):
    """Per operand type, forced path ("" for the default), layer class and
    pass: the geomean of cuDNN's time over mpgemm's (above 1: mpgemm faster),
    the number of layers, and the class's share of cuDNN's fwd+bwd time
    over the suite. A class "all" sums every layer."""
    conv = [r for r in report["results"] if r["suite"] == "conv" and r["check_passed"] is not False]
    by_key = {(r["dtype"], _shape(r), r["impl"]): r for r in conv}
    total, groups = {}, {}
    names = dict(CONV_PASS_ENDINGS)
    for r in conv:
        if not r["baseline"] and r["impl"].endswith(" fwd+bwd"):
            total[r["dtype"]] = total.get(r["dtype"], 0.0) + r["median_ms"]
    for r in conv:
        words = r["impl"].split(" ")
        base = by_key.get((r["dtype"], _shape(r), r["baseline"]))
        if words[0] != "mpgemm" or words[-1] not in names or base is None:
            continue
        path = " ".join(w for w in words[1:-1] if w != "bf16")
        cudnn_both = by_key.get((r["dtype"], _shape(r), r["baseline"].rsplit(" ", 1)[0] + " fwd+bwd"))
        for layer_class in (conv_layer_class(r["shape"]), "all"):
            group = groups.setdefault((r["dtype"], path, layer_class, names[words[-1]]),
                                      {"logs": [], "share_ms": 0.0})
            group["logs"].append(math.log(base["median_ms"] / r["median_ms"]))
            group["share_ms"] += cudnn_both["median_ms"] if cudnn_both else 0.0
    rows = []
    for (dtype, path, layer_class, name), g in groups.items():
        rows.append(dict(dtype=dtype, path=path or "default", layer_class=layer_class, conv_pass=name,
                         layers=len(g["logs"]), ratio=math.exp(sum(g["logs"]) / len(g["logs"])),
                         share=g["share_ms"] / total[dtype] if total.get(dtype) else None))
    return sorted(rows, key=lambda r: (r["dtype"], r["path"] != "default", r["path"], r["layer_class"] == "all",
                                       r["layer_class"]))


def conv_pass_table(report):
    """conv_pass_rows as a table: a row per type, path and class, a column per pass."""
    rows = conv_pass_rows(report)
    if not rows:
        return []
    passes = [name for _, name in CONV_PASS_ENDINGS]
    table = {}
    for r in rows:
        entry = table.setdefault((r["dtype"], r["path"], r["layer_class"]), {"layers": r["layers"], "share": None})
        entry[r["conv_pass"]] = r["ratio"]
        if r["conv_pass"] == "fwd+bwd":
            entry["share"] = r["share"]
    header = ["type", "path", "layers", "n", "cuDNN share"] + [f"{p} vs cuDNN" for p in passes]
    lines = []
    for (dtype, path, layer_class), entry in table.items():
        share = "" if entry["share"] is None else f"{100 * entry['share']:.0f}%"
        lines.append([dtype, path, layer_class, str(entry["layers"]), share]
                     + [f"{entry[p]:.2f}x" if p in entry else "" for p in passes])
    return [display.format_table(header, lines, rule=False)]


def write_csv(report, path):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["suite", "case", "shape", "impl", "dtype", "baseline", "median_ms", "tflops", "check_passed",
                         "times_ms"])
        for r in report["results"]:
            writer.writerow([r["suite"], r["case"], _shape(r), r["impl"], r["dtype"], r["baseline"], r["median_ms"],
                             r["tflops"], r["check_passed"], " ".join(f"{t:.6f}" for t in r["times_ms"])])


def plot_report(report, path):
    """TFLOP/s of each GEMM implementation: against size for the square
    sweep, else one group of bars per shape run."""
    plt = display.pyplot("bench")
    fig, ax = plt.subplots(figsize=(7.5, 4))
    gemm = [r for r in report["results"] if r["suite"] == "gemm" and r["tflops"]]
    square = [r for r in gemm if r["case"] == "square"]
    if square:
        for impl in dict.fromkeys(r["impl"] for r in square):
            points = sorted((r["shape"][0], r["tflops"]) for r in square if r["impl"] == impl)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M = N = K")
    else:
        shapes = list(dict.fromkeys(_shape(r) for r in gemm))
        impls = list(dict.fromkeys(r["impl"] for r in gemm))
        # fp32 out against cuBLAS: the 16-bit-out and torch.mm rows are the same story twice over.
        impls = [i for i in impls if i.endswith("fp32-out") and not i.startswith("torch.mm")] or impls
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            values = {_shape(r): r["tflops"] for r in gemm if r["impl"] == impl}
            ax.bar([j + i * width for j in range(len(shapes))], [values.get(s, 0) for s in shapes], width, label=impl)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes)
        ax.set_xlabel("M x N x K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{report['device']} @ {report['git_commit'][:10]}, {report['date'][:10]}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
