"""Command line: `python -m mpgemm <command>`."""

import argparse
import sys

from . import benchmarks, demo, kernel_report, verify


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mpgemm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("verify", help="check the active backend against a float64 reference")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="backend to check (auto: cuda when a GPU and a CUDA build are present)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and shapes")
    p.add_argument("--sweep", type=int, default=0, metavar="N", help="also check N random shapes")
    p.set_defaults(run=verify.main)

    p = commands.add_parser("demo", help="train a small CNN in fp32, with torch.amp and with mpgemm; print a table")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--batch-sizes", type=positive_int, nargs="+", help="batch sizes to run (default 32 64 128)")
    p.add_argument("--steps", type=positive_int, help="training steps per run")
    p.add_argument("--quick", action="store_true", help="one batch size, fewer steps and images")
    p.add_argument("--plot", metavar="PNG", help="also draw the figures to this file (needs matplotlib)")
    p.set_defaults(run=demo.main)

    p = commands.add_parser("bench", help="time mpgemm against cuBLAS and torch")
    p.add_argument("suite", nargs="?", choices=[*benchmarks.SUITES, "all"], default="all")
    p.add_argument("--shapes", type=benchmarks.parse_shapes, metavar="MxNxK[,MxNxK...]",
                   help="shapes to run instead of the suites' (linear: tokens x out_features x in_features)")
    p.add_argument("--quick", action="store_true", help="a few representative shapes")
    p.add_argument("--reps", type=positive_int, default=20, help="timed repetitions per case (median reported)")
    p.add_argument("--json", metavar="PATH", help="write the report, raw timings included, as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the results as CSV")
    p.add_argument("--plot", metavar="PNG", help="plot TFLOP/s against size (needs matplotlib)")
    p.set_defaults(run=benchmarks.main)

    p = commands.add_parser("inspect", help="list the compiled kernels and their Tensor Core instructions")
    p.add_argument("--binary", help="a cubin, object or library to read instead of the extension")
    p.set_defaults(run=kernel_report.main)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
