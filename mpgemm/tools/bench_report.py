"""What `python -m mpgemm bench` shows of a report: the text table, CSV and a plot.

A row whose result check failed shows FAIL and no speed; a CPU report shows
no comparison at all."""

import csv

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
    lines += notes(report)
    if not report.get("complete", True):
        lines.append("incomplete: the run stopped before its last case")
    return "\n".join(lines)


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
