"""Command line: `python -m mpgemm <command>`."""

import argparse
import sys

from . import benchmarks, demo, host_bench, kernel_report, train_bench, training, verify

DEFAULT_REPS = 20
# Options of one kind of bench that the other refuses: dest -> flag.
# (--batch-sizes serves both: the batches of bench train and of the conv suite's ResNet-50 layers.)
KERNEL_SUITE_OPTIONS = {"shapes": "--shapes", "dtypes": "--dtypes", "reps": "--reps", "csv": "--csv",
                        "plot": "--plot", "conv_paths": "--conv-paths"}
TRAIN_OPTIONS = {"time_limit": "--time-limit", "models": "--models", "ways": "--ways", "profile": "--profile",
                 "no_search": "--no-search"}


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def run_bench(args):
    """`bench train` runs train_bench, `bench host` host_bench, the other
    suites benchmarks; each refuses the options of the others."""
    if args.suite == "host":
        given = [flag for dest, flag in {**KERNEL_SUITE_OPTIONS, **TRAIN_OPTIONS, "batch_sizes": "--batch-sizes",
                                         "quick": "--quick"}.items() if getattr(args, dest) not in (None, False)]
        if given:
            print(f"mpgemm bench: {', '.join(given)} do not apply to host (it takes --json alone)")
            return 2
        return host_bench.main(args)
    train = args.suite == "train"
    for dest, flag in (KERNEL_SUITE_OPTIONS if train else TRAIN_OPTIONS).items():
        if getattr(args, dest) not in (None, False):
            print(f"mpgemm bench: {flag} applies to "
                  f"{'the kernel suites, not to train' if train else 'bench train only, not to ' + args.suite}")
            return 2
    if train:
        return train_bench.main(args)
    if args.reps is None:
        args.reps = DEFAULT_REPS
    return benchmarks.main(args)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mpgemm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("verify", help="check the active backend against a float64 reference")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="backend to check (auto: cuda when a GPU and a CUDA build are present)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and shapes")
    p.add_argument("--sweep", type=int, default=0, metavar="N", help="also check N random shapes")
    p.set_defaults(run=verify.main)

    p = commands.add_parser("demo", help="train a small CNN in fp32, and with torch.amp and mpgemm in fp16 and "
                                         "bf16; print a table")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--batch-sizes", type=positive_int, nargs="+", help="batch sizes to run (default 32 64 128)")
    p.add_argument("--steps", type=positive_int, help="training steps per run")
    p.add_argument("--quick", action="store_true", help="one batch size, fewer steps and images")
    p.add_argument("--plot", metavar="PNG", help="also draw the figures to this file (needs matplotlib)")
    p.set_defaults(run=demo.main)

    p = commands.add_parser("bench", help="time mpgemm against cuBLAS and torch; `train`: whole training steps")
    p.add_argument("suite", nargs="?", choices=[*benchmarks.SUITES, "all", "train", "host"], default="all",
                   help="all: the kernel suites; train: ResNet-50 and a GPT-2 block trained five ways; host: the "
                        "host's time per call of the ops and of a training step, beside torch's")
    p.add_argument("--shapes", type=benchmarks.parse_shapes, metavar="MxNxK[,MxNxK...]",
                   help="shapes to run instead of the suites' (linear: tokens x out_features x in_features)")
    p.add_argument("--dtypes", type=benchmarks.parse_dtypes, metavar="fp16[,bf16]",
                   help="operand types of the kernel suites (default fp16,bf16; the ceiling is fp16 only)")
    p.add_argument("--quick", action="store_true",
                   help="a few representative shapes (train: batch 32 for 60 s on a GPU, a tiny CPU run without)")
    p.add_argument("--reps", type=positive_int, help=f"timed repetitions per case (median reported; default "
                                                      f"{DEFAULT_REPS})")
    p.add_argument("--json", metavar="PATH", help="write the report, raw timings included, as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the results as CSV")
    p.add_argument("--plot", metavar="PNG", help="plot TFLOP/s against size (needs matplotlib)")
    p.add_argument("--time-limit", type=train_bench.positive_seconds, metavar="SECONDS",
                   help=f"train: bound on the whole run (default {train_bench.GPU_TIME_LIMIT_S:.0f}, "
                        f"with --quick {train_bench.GPU_QUICK_TIME_LIMIT_S:.0f})")
    p.add_argument("--batch-sizes", type=positive_int, nargs="+", metavar="N",
                   help="train: batch sizes, in images or sequences, for every model "
                        "(default 32 64 128 256 images, 8 16 32 64 sequences); conv: the batch sizes of "
                        "ResNet-50's convolutions (default 32 256)")
    p.add_argument("--conv-paths", type=benchmarks.parse_conv_paths, metavar="wgmma[,wgmma_narrow,wmma]",
                   help="conv: also time mpgemm on each of these paths, beside the default (wgmma: "
                        "MPGEMM_CONV_PATH=wgmma with MPGEMM_DGRAD_ONE_LAUNCH=0, MPGEMM_CHUNKED_FOLD=0, "
                        "MPGEMM_M64_TILE=0, MPGEMM_GATHERED_FOLD=0, MPGEMM_DEPTHWISE_SLIDING_WGRAD=0, "
                        "MPGEMM_DEPTHWISE_SLIDING_GATHER=0 and MPGEMM_CONV_N16_TILE=0; "
                        "wgmma_narrow: wgmma with MPGEMM_NARROW_TILES=1; wgmma_staged: wgmma with "
                        "MPGEMM_STAGED_ROW_STORES=1; wgmma_opt_in: wgmma with every switch of the sm_90 default on "
                        "(both, MPGEMM_DGRAD_ONE_LAUNCH=1 and MPGEMM_CHUNKED_FOLD=1) and the opt-in "
                        "MPGEMM_M64_TILE=1, MPGEMM_GATHERED_FOLD=1, MPGEMM_DEPTHWISE_SLIDING_WGRAD=1, "
                        "MPGEMM_DEPTHWISE_SLIDING_GATHER=1 and MPGEMM_CONV_N16_TILE=1; wmma: the WMMA kernels, with MPGEMM_CONV_N16_TILE=0; wmma_n16: "
                        "the same with MPGEMM_CONV_N16_TILE=1; gemm: 1x1 convolutions as GEMMs)")
    p.add_argument("--models", type=train_bench.parse_models, metavar="NAME[,NAME]",
                   help=f"train: models to run, of {', '.join(train_bench.WORKLOADS)} "
                        f"(default {','.join(train_bench.DEFAULT_MODELS)})")
    p.add_argument("--ways", type=train_bench.parse_ways, metavar="WAY[,WAY]",
                   help=f"train: ways to train (default: {','.join(train_bench.WAYS)}; also "
                        f"{','.join(w for w in training.ALL_WAYS if w not in train_bench.WAYS)})")
    p.add_argument("--profile", action="store_true",
                   help="train: also profile a few steps of mpgemm and torch.amp (fp16) per model at its largest "
                        "batch: the kernels that take the most time, and the step's time by kind of kernel")
    p.add_argument("--no-search", action="store_true", help="train: skip the largest-batch searches")
    p.set_defaults(run=run_bench)

    p = commands.add_parser("inspect", help="list the compiled kernels and their Tensor Core instructions")
    p.add_argument("--binary", help="a cubin, object or library to read instead of the extension")
    p.set_defaults(run=kernel_report.main)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
