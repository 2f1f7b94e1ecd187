"""A dependency-free progress bar for long command-line runs (on stderr)."""

import sys
import time


class Progress:
    def __init__(self, total, label="", stream=None, width=30):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.perf_counter()

    def advance(self, n=1, note=""):
        self.done = min(self.done + n, self.total)
        filled = self.width * self.done // self.total
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{self.done}/{self.total} {elapsed:5.1f}s {note}".ljust(100))
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()
