"""summary.md and summary.json of a GPU check run (bench/gpu_check.py).

Each step's result line is read from what the step left in the raw folder:
the bench and train JSON reports, the build info, pytest's JUnit XML, ncu's
CSV, or the last lines of its log. A step that left nothing readable says so;
the logs are in the archive beside the summary."""

import csv
import io
import json
import math
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ncu metrics shown in the summary, by what they tell (all of them are in the archive).
PROFILE_METRICS = {
    "kernel time": "gpu__time_duration.sum",
    "SM clock": "sm__cycles_elapsed.avg.per_second",
    "tensor pipe active (HMMA)": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "SM throughput": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "warps active": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "shared ld bank conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "shared ld wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "shared st bank conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "shared st wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "L2 throughput": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 bytes/s": "lts__t_bytes.sum.per_second",
    "DRAM throughput": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
}
STALL_METRIC = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")


def _load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _log_tail(raw, result, lines=3):
    try:
        with open(os.path.join(raw, result["log"]), errors="replace") as f:
            return [line.rstrip() for line in f.readlines()[-lines:]]
    except OSError:
        return []


def _bench_report():
    """mpgemm's own reading of a bench report. Imported when a bench step has
    left a report, so the build step has made the package importable."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from mpgemm.tools import bench_report

    return bench_report


def _rows_by(report, impl):
    return {tuple(r["shape"]): r for r in report["results"] if r["impl"] == impl}


def _ratio(row, base):
    if row is None or base is None or row["check_passed"] is False:
        return None
    return base["median_ms"] / row["median_ms"]


def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


# What an impl's name adds for fp16 and for bf16 operands (mpgemm/tools/benchmarks.py).
BF16_TAGS = ("", " bf16")
# The GEMM table's speed ratios: (impl, baseline, column). The first of each
# operand type, against cuBLAS with fp32 out, makes the headline.
GEMM_RATIOS = (("mpgemm fp32-out", "cublas fp32-out", "mpgemm/cuBLAS (fp32 out)"),
               ("mpgemm fp16-out", "torch.mm fp16-out", "mpgemm/torch.mm (fp16 out)"),
               ("mpgemm bf16 fp32-out", "cublas bf16 fp32-out", "mpgemm/cuBLAS (bf16 in, fp32 out)"),
               ("mpgemm bf16-out", "torch.mm bf16-out", "mpgemm/torch.mm (bf16 out)"))


def gemm_section(report):
    cb32, mp32 = _rows_by(report, "cublas fp32-out"), _rows_by(report, "mpgemm fp32-out")
    ratios = {impl: {shape: _ratio(row, _rows_by(report, base).get(shape))
                     for shape, row in _rows_by(report, impl).items()} for impl, base, _ in GEMM_RATIOS}
    header = ["M x N x K", "cuBLAS fp16 TFLOP/s", "mpgemm fp16 TFLOP/s"] + [column for *_, column in GEMM_RATIOS]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    shapes = dict.fromkeys(tuple(r["shape"]) for r in report["results"] if r["impl"].startswith("mpgemm"))
    for shape in shapes:
        lines.append(f"| {'x'.join(map(str, shape))} | {_fmt(cb32.get(shape, {}).get('tflops'), '.1f')} | "
                     f"{_fmt(mp32.get(shape, {}).get('tflops'), '.1f')} | "
                     + " | ".join(_fmt(ratios[impl].get(shape), '.2f', 'x') for impl, *_ in GEMM_RATIOS) + " |")

    def against_cublas(impl):
        return ", ".join(f"{shape[0]}^3 {_fmt(ratio, '.2f', 'x')}" if len(set(shape)) == 1
                         else f"{'x'.join(map(str, shape))} {_fmt(ratio, '.2f', 'x')}"
                         for shape, ratio in ratios[impl].items())

    headline = "mpgemm/cuBLAS " + against_cublas("mpgemm fp32-out")
    if ratios["mpgemm bf16 fp32-out"]:
        headline += "; bf16 " + against_cublas("mpgemm bf16 fp32-out")
    return headline, lines


def ceiling_section(report):
    peak = report.get("peak_tflops", {}).get("value")
    parts = [f"{r['shape'][0]} block/SM {_fmt(r['tflops'], '.0f')} TFLOP/s"
             + (f" ({100 * r['tflops'] / peak:.0f}% of peak)" if peak and r["tflops"] else "")
             for r in report["results"]]
    return "; ".join(parts), []


def paired_section(report, pairs):
    """Geometric mean and range of impl/baseline speed ratios, per pair of names."""
    parts = []
    for impl, base in pairs:
        rows, bases = _rows_by(report, impl), _rows_by(report, base)
        ratios = [x for x in (_ratio(row, bases.get(shape)) for shape, row in rows.items()) if x]
        if ratios:
            mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            parts.append(f"{impl} {mean:.2f}x of {base} "
                         f"(geomean of {len(ratios)}, {min(ratios):.2f}-{max(ratios):.2f})")
    return "; ".join(parts), []


def conv_section(report):
    """Each pass's geomean against cuDNN's, on the default path and on each
    forced one; the per-class table below."""
    paths = ["", *(f" {path}" for path in report.get("conv_paths", []))]
    pairs = [(f"mpgemm{path}{t} {p}", f"cudnn{t} {p}") for t in BF16_TAGS for path in paths
             for p in ("fwd", "dgrad", "wgrad", "fwd+bwd")]
    headline, _ = paired_section(report, pairs)
    if headline:
        headline = f"{_bench_report().conv_bias_note(report)}; {headline}"
    table = _bench_report().conv_pass_table(report)
    return headline, ["```", *table, "```"] if table else []


def bench_step(name):
    def summarize(raw, result, report_name=f"{name}.json"):
        report = _load_json(os.path.join(raw, report_name))
        if report is None:
            return "no report", [], None
        passes = [(tag, p) for tag in BF16_TAGS for p in ("fwd", "fwd+bwd")]
        section = {"gemm": gemm_section, "ceiling": ceiling_section,
                   "mlp": lambda r: paired_section(r, [(f"mpgemm fused{t} {p}", f"torch unfused{t} {p}")
                                                       for t, p in passes] +
                                                   [(f"mpgemm fused {fused}{t} fwd+bwd", f"torch unfused{t} fwd+bwd")
                                                    for fused in ("recomputed-z", "saved-z+dbias") for t in BF16_TAGS] +
                                                   [(f"mpgemm mlp{t} {p}", f"torch unfused{t} {p}")
                                                    for t, p in passes] +
                                                   [(f"mpgemm mlp {fused}{t} fwd+bwd", f"torch unfused{t} fwd+bwd")
                                                    for fused in ("saved-z", "dgelu", "saved-z+dgelu",
                                                                  "saved-z+dgelu+dbias")
                                                    for t in BF16_TAGS] +
                                                   [(f"mpgemm {impl}{t}", f"torch mm+gelu_backward{t}")
                                                    for impl in ("gemm+gelu_backward", "dgelu", "dgelu pingpong")
                                                    for t in BF16_TAGS] +
                                                   [(f"mpgemm gated_mlp{t} {p}", f"torch unfused{t} {p}")
                                                    for t, p in passes] +
                                                   [(f"mpgemm gated_mlp torch gating{t} fwd+bwd",
                                                     f"torch unfused{t} fwd+bwd") for t in BF16_TAGS]),
                   "conv": conv_section}[name]
        headline, lines = section(report)
        lines = [f"- {note}" for note in _bench_report().notes(report)] + lines
        failed = [r for r in report["results"] if r["check_passed"] is False]
        if failed:
            headline = f"{len(failed)} results FAILED their check; " + headline
        if not report.get("complete", True):
            headline = "INCOMPLETE; " + headline
        return headline, lines, {"gpu_state": report.get("gpu_state"), "failed_checks": len(failed)}

    return summarize


def parse_ncu_csv(text):
    """{metric: (value, unit)} of the one profiled kernel in `ncu --csv --page raw` output."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return {}
    header, units, values = rows[0], rows[1], rows[2]
    return {name: (value, unit) for name, unit, value in zip(header, units, values)}


def profile_step(raw, result):
    try:
        with open(os.path.join(raw, "profile_ncu.csv")) as f:
            metrics = parse_ncu_csv(f.read())
    except OSError:
        metrics = {}
    if not metrics:
        fallback = _load_json(os.path.join(raw, "profile.json"))
        if fallback is None:
            return "no profile", [], None
        return (f"no ncu: {fallback['kernel_ms']:.3f} ms, {fallback['tflops']:.0f} TFLOP/s, "
                f"{_fmt(fallback['cycles'], '.3g')} cycles ({fallback['source']})"), [], fallback
    shown = {label: metrics[name] for label, name in PROFILE_METRICS.items() if name in metrics}
    stalls = sorted(((m[1], float(v[0].replace(",", ""))) for name, v in metrics.items()
                     if (m := STALL_METRIC.fullmatch(name)) and _is_number(v[0])), key=lambda s: -s[1])
    lines = ["| ncu metric (4096^3 GEMM) | value |", "| --- | --- |"]
    lines += [f"| {label} | {value} {unit} |" for label, (value, unit) in shown.items()]
    if stalls:
        lines.append("| top stall reasons (warps per issue) | "
                     + ", ".join(f"{reason} {value:.2f}" for reason, value in stalls[:5]) + " |")
    tensor = shown.get("tensor pipe active (HMMA)")
    headline = f"tensor pipe active {tensor[0]}%" if tensor else "ncu ran"
    if stalls:
        headline += f"; top stall: {stalls[0][0]}"
    return headline, lines, {"metrics": {k: v[0] for k, v in shown.items()}, "stalls": stalls[:8]}


def _is_number(text):
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def tests_step(raw, result, report="tests.xml"):
    try:
        suite = ElementTree.parse(os.path.join(raw, report)).getroot()
    except (OSError, ElementTree.ParseError):
        return "no test report", _log_tail(raw, result), None
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    headline = (f"{counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']} passed, "
                f"{counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped")
    return headline, [f"- FAILED {name}" for name in failed], dict(counts, failed=failed)


def log_step(pattern):
    """The last line of the log that matches `pattern` (e.g. a tool's summary line)."""
    def summarize(raw, result):
        tail = _log_tail(raw, result, lines=200)
        found = [line for line in tail if re.search(pattern, line)]
        return (found[-1].strip("= ") if found else "no summary line: " + (tail[-1] if tail else "empty log")), [], None

    return summarize


def build_step(raw, result):
    info = _load_json(os.path.join(raw, "build_info.json"))
    if info is None:
        return "no build info", _log_tail(raw, result), None
    return f"{info['backend']} build for {', '.join(info['cuda_archs'])}, CUDA {info['cuda_version']}", [], info


def train_step(raw, result, names=None):
    """Per report (train*.json: one per model, and one per kernel path asked
    for; or the files `names`) and model: the speedups over fp32 and the
    ratios to torch.amp at the largest batch every 16-bit way of the report
    ran (a way that ran at no batch named apart, with its reason), and the
    largest batches found; the text reports, profiles included, from the
    log."""
    if names is None:
        names = sorted(f for f in os.listdir(raw) if f.startswith("train") and f.endswith(".json"))
    reports = [r for r in (_load_json(os.path.join(raw, name)) for name in names) if r is not None]
    if not reports:
        return "no report", _log_tail(raw, result), None
    parts = []
    for report in reports:
        paths = report.get("provenance", {}).get("kernel_paths") or {}
        tag = "".join(f" ({name}={value})" for name, value in paths.items())
        for model in report["config"]["models"]:
            runs = [r for r in report["runs"] if r["model"] == model and r["status"] == "ok"]
            all_ways = [w for w in dict.fromkeys(r["way"] for r in runs) if w != "fp32"]
            failed = {}
            for r in report["runs"]:
                if r["model"] == model and r["way"] not in all_ways and r["way"] != "fp32":
                    failed.setdefault(r["way"], r)  # a way that ran at no batch: its first run's reason
            parts += [f"{model}{tag} {way}: {r['status']}" + (f" ({r['reason']})" if r.get("reason") else "")
                      for way, r in failed.items()]
            by_batch = {}
            for r in runs:
                by_batch.setdefault(r["batch_size"], {})[r["way"]] = r
            complete = [b for b, ways in by_batch.items() if all(w in ways for w in all_ways)]
            if complete:
                ways = by_batch[max(complete)]
                parts.append(f"{model}{tag} batch {max(complete)}: " + ", ".join(
                    f"{way} {_fmt(ways[way]['speedup_vs_fp32'], '.2f', 'x')}"
                    + (f" ({ways[way]['vs_torch_amp']:.2f} of torch.amp)" if ways[way].get("vs_torch_amp") else "")
                    for way in all_ways))
            fits = [f"{s['way']} {'>=' if s['status'] == 'at least' else ''}{s['largest_fitting']}"
                    for s in report["largest_batch"] if s["model"] == model and s["largest_fitting"]]
            if fits:
                parts.append(f"{model} largest batch: " + ", ".join(fits))
    lines = ["```", *_log_tail(raw, result, lines=300), "```"]
    headline = "; ".join(parts) or "no batch ran in every way"
    if not all(r.get("complete", True) for r in reports):
        headline = "INCOMPLETE; " + headline
    return headline, lines, {"elapsed_s": [r.get("elapsed_s") for r in reports]}


# The host step's reports (gpu_check.HOST): bench host's, then the blocks at batch 8.
HOST_TRAIN_REPORTS = ("train_gpt2-block_batch8.json", "train_gpt2-block_batch8_layer_norm.json",
                      "train_llama-block_batch8.json")


def host_step(raw, result):
    """Each case's host time per call against torch's (host.json), then the
    blocks at batch 8 as train_step gives them."""
    report = _load_json(os.path.join(raw, "host.json"))
    cases = (f"{case['name']} {case['ratio']:.2f}x" for case in report["cases"]) if report else ["no host.json"]
    headline = "host time per call against torch's: " + ", ".join(cases)
    reports = [name for name in HOST_TRAIN_REPORTS if os.path.exists(os.path.join(raw, name))]
    train_headline, lines, data = train_step(raw, result, reports) if reports else ("no block report", [], None)
    return f"{headline}; {train_headline}", lines, {"host": report, "train": data}


def hopper_step(raw, result):
    """The probes' verdict and the Hopper GEMM's count of right cases."""
    tail = _log_tail(raw, result, lines=400)
    found = [line.strip() for line in tail
             if re.search(r"probes match|PROBES FAILED|cases right|no Hopper path|failed$", line)]
    return ("; ".join(found) or "no summary line: " + (tail[-1] if tail else "empty log")), [], None


# The ways bench/wgmma_check.py's speed table times, the forced or opt-in
# ones (split-K wherever its model splits, stream-K on the Hopper block,
# padded operands) last: each on the shapes it applies to.
WGMMA_SCHEDULES = ("wgmma", "wgmma_direct", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64", "wmma",
                   "wgmma_splitk", "wgmma_streamk", "wgmma_padded")


def wgmma_speed_step(raw, result):
    """Each schedule's geomean against cuBLAS over the shapes timed, and a
    table of every shape (bench/wgmma_check.py's rows, from its JSON or, for
    a run cut short, the rows its log printed)."""
    report = _load_json(os.path.join(raw, "wgmma_speed.json"))
    if report is not None:
        rows = report.get("speed", [])
    else:
        rows = [json.loads(line) for line in _log_tail(raw, result, lines=1000) if line.startswith("{")]
    if not rows:
        tail = _log_tail(raw, result)
        return "no rows: " + (tail[-1] if tail else "empty log"), [], None
    # A schedule timed on some shapes only (the narrow tiles: narrow outputs) is averaged over those.
    timed = {name: [r[f"{name}_vs_cublas"] for r in rows if f"{name}_vs_cublas" in r] for name in WGMMA_SCHEDULES}
    geomean = {name: math.exp(sum(math.log(v) for v in values) / len(values))
               for name, values in timed.items() if values}
    headline = (f"geomean vs cuBLAS over {len(rows)} shapes: "
                + ", ".join(f"{name} {value:.2f}x" + ("" if len(timed[name]) == len(rows) else
                                                      f" (over {len(timed[name])})")
                            for name, value in geomean.items()))
    lines = ["| M x N x K | type | layouts | " + " | ".join(WGMMA_SCHEDULES) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in WGMMA_SCHEDULES) + " |"]
    for r in rows:
        cells = (f"{r[f'{name}_vs_cublas']:.2f}" if f"{name}_vs_cublas" in r else "-" for name in WGMMA_SCHEDULES)
        lines.append(f"| {r['m']}x{r['n']}x{r['k']} | {r['dtype']} | {r['layouts']} | " + " | ".join(cells) + " |")
    # The small GEMM after each predecessor (wgmma_check.predecessors), as its log line says it.
    after = [line for line in _log_tail(raw, result, lines=1000) if line.startswith("a small Hopper GEMM")]
    lines += [""] + after if after else []
    training = training_sweep_line(report.get("training", []) if report else [])
    lines += ["", training] if training else []
    return headline, lines, {"geomean_vs_cublas": geomean}


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def training_sweep_line(rows):
    """The training sweep against cuBLAS: the default's geomean over every
    GEMM; over those whose K the default splits on the Hopper block, the
    default's and whole K's; and over those where stream-K is planned
    (MPGEMM_STREAM_K=1) the default's, split-K's where it splits them, and
    stream-K's; "" without rows."""
    if not rows:
        return ""
    line = f"training sweep: default {_geomean([r['default_vs_cublas'] for r in rows]):.2f}x over {len(rows)} GEMMs"
    split = [r for r in rows if "whole_k_vs_cublas" in r]
    if split:
        line += (f"; where the default splits K ({len(split)}): default "
                 f"{_geomean([r['default_vs_cublas'] for r in split]):.2f}x, "
                 f"whole K {_geomean([r['whole_k_vs_cublas'] for r in split]):.2f}x")
    streamed = [r for r in rows if "wgmma_streamk_vs_cublas" in r]
    if streamed:
        split = [r["wgmma_splitk_vs_cublas"] for r in streamed if "wgmma_splitk_vs_cublas" in r]
        line += (f"; where stream-K is planned ({len(streamed)}): default "
                 f"{_geomean([r['default_vs_cublas'] for r in streamed]):.2f}x, "
                 + (f"split-K {_geomean(split):.2f}x (over {len(split)}), " if split else "")
                 + f"stream-K {_geomean([r['wgmma_streamk_vs_cublas'] for r in streamed]):.2f}x")
    return line


SUMMARIZERS = {
    "build": build_step, "hopper": hopper_step, "inspect": log_step(r"contain Tensor Core instructions"),
    "gemm": bench_step("gemm"), "ceiling": bench_step("ceiling"), "mlp": bench_step("mlp"),
    "conv": bench_step("conv"), "profile": profile_step, "tests": tests_step,
    "verify": log_step(r"\d+ passed, \d+ failed"), "cublas-check": log_step(r"cases failed"),
    "memcheck": log_step(r"ERROR SUMMARY"), "racecheck": log_step(r"RACECHECK SUMMARY|ERROR SUMMARY"),
    "synccheck": log_step(r"ERROR SUMMARY"), "train": train_step, "wgmma-speed": wgmma_speed_step,
    "conv-tiles": log_step(r"Hopper convolution kernels that ran|no Hopper path|expected the Hopper"),
    "host": host_step,
}


def write(outdir, raw, label, info, results):
    sections, steps = [], []
    for result in results:
        try:
            headline, lines, data = SUMMARIZERS[result["name"]](raw, result)
        except Exception as e:  # a summary must never lose the run: say what could not be read
            headline, lines, data = f"summary unreadable ({type(e).__name__}: {e})", [], None
        steps.append(dict(result, headline=headline, data=data))
        if lines:
            sections += [f"\n## {result['name']}\n", *lines]
    warning = (["**The commit is unknown: run `make gpu-bundle` before the tree is copied to the GPU machine.**", ""]
               if info["git_commit"] == "unknown" else [])
    device = info["device"] or "no GPU visible to nvidia-smi"
    md = [f"# mpgemm GPU check, {label}", "", *warning,
          f"{device} (compute capability {info['compute_capability']}, driver {info['driver_version']}, "
          f"{info['memory']}, max SM clock {info['max_sm_clock']}); torch {info['torch_version']}, CUDA "
          f"{info['cuda_version']}; commit {info['git_commit']}; {info['date']}", "",
          "| step | status | s | estimate s | limit s | result |", "| --- | --- | --- | --- | --- | --- |"]
    md += [f"| {s['name']} | {s['status'].upper()} | {s['seconds']} | {s['estimate_s']} | {s['limit_s']} | "
           f"{s['headline']} |" for s in steps]
    md.append(f"\nTotal {sum(s['seconds'] for s in steps):.0f} s of {sum(s['limit_s'] for s in steps)} s of "
              "limits. Logs and raw JSON: gpu_check.tar.gz.")
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write("\n".join(md + sections) + "\n")
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump({"label": label, "provenance": info, "steps": steps}, f, indent=1)
