"""Launches ranks, runs the reference model, profiles it, and holds the thin CLI."""

__version__ = "0.1.0"
