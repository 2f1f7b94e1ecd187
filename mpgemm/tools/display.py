"""What the command-line tools share to show results: aligned text tables,
prose wrapped to REPORT_WIDTH columns, matplotlib for --plot, and --json
reports saved as they grow."""

import json
import textwrap

REPORT_WIDTH = 100


def wrap(text, indent=""):
    """text in lines of at most REPORT_WIDTH columns, continuation lines indented."""
    return textwrap.fill(text, width=REPORT_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)


def format_table(header, rows, *, right_align=False, rule=True):
    """Rows of cells as aligned text columns, with a rule under the header."""
    rows = [[str(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    align = str.rjust if right_align else str.ljust
    lines = ["  ".join(align(cell, w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def pyplot(command):
    """matplotlib.pyplot on a file backend, or a clear exit if it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"mpgemm {command} --plot needs matplotlib: pip install matplotlib") from e
    return plt


def json_saver(path):
    """save(report): writes the report to `path` as JSON (nothing without a
    path). Reports are saved after each measurement, so that a run stopped by
    a time limit leaves what it measured."""
    def save(report):
        if path:
            with open(path, "w") as f:
                json.dump(report, f, indent=1)

    return save
