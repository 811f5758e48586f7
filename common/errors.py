"""One error type for input commprobe cannot use: the CLI prints its message as one line and
exits 2. Each reader refines it where the problem is found (a trace, a bundle, a hardware
profile, a gate baseline), so the message names the file and what is wrong with it."""

from __future__ import annotations


class InputError(ValueError):
    """Unusable input; the message is one line that names the input."""
