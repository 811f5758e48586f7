"""Launches ranks, runs the reference model, profiles it, and holds the thin CLI."""
