"""Progress of long command-line runs: a tqdm bar on stderr when stderr is a
terminal, nothing at all when it is redirected to a file or a pipe (a log
must not fill with carriage-return updates), or when tqdm is missing."""

import sys


class Progress:
    def __init__(self, total, label="", stream=None):
        stream = stream or sys.stderr
        self._bar = None
        if stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=label, file=stream, leave=False, dynamic_ncols=True)

    def advance(self, n=1, note=""):
        if self._bar is None:
            return
        self._bar.set_postfix_str(note, refresh=False)
        self._bar.update(n)
        if self._bar.n >= self._bar.total:
            self._bar.close()
