"""Progress bars draw on a terminal only: a redirected log gets none of them."""

import io

from mpgemm.tools.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_no_output_when_redirected():
    log = io.StringIO()
    bar = Progress(50, "bench", stream=log)
    for _ in range(50):
        bar.advance(note="gemm 64x64x64")
    assert log.getvalue() == ""


def test_a_bar_on_a_terminal():
    terminal = Terminal()
    bar = Progress(3, "demo", stream=terminal)
    for _ in range(3):
        bar.advance(note="fp32 batch 64")
    assert "demo:" in terminal.getvalue() and "/3 [" in terminal.getvalue()
