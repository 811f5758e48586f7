"""One error type for input commprobe cannot use: the CLI prints its message as one line and
exits 2. Each reader refines it where the problem is found (a trace, a bundle, a hardware
profile, a gate baseline), so the message names the file and what is wrong with it."""

from __future__ import annotations


def one_line(msg: str) -> str:
    """The message with its control characters escaped: a file name with a newline, a trace's text
    with an escape sequence, stays one line and prints nothing a terminal would obey."""
    return "".join(c if c >= " " and c != "\x7f" else ("\\n" if c == "\n" else f"\\x{ord(c):02x}") for c in msg)


class InputError(ValueError):
    """Unusable input; the message is one line that names the input (control characters escaped
    here, wherever the message was made)."""

    def __init__(self, msg: object = "", *args):
        super().__init__(one_line(str(msg)), *args)
