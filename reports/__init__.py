"""Renderers of analyzer results (HTML, terminal). They compute nothing new."""
