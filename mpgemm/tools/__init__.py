"""mpgemm's command-line tools (`python -m mpgemm ...`): bench, verify,
inspect and the training demo, with what they share (timing, tables,
progress, reading machine code). The library itself is `mpgemm`."""
