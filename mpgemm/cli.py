"""Command line: `python -m mpgemm <command>`."""

import argparse
import sys

from . import verify


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mpgemm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("verify", help="check the active backend against a float64 reference")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="backend to check (auto: cuda when a GPU and a CUDA build are present)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.set_defaults(run=verify.main)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
