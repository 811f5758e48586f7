"""What-if planning: a calibrated cost model of TP x CP x EP inference (pure Python + numpy, no torch)."""
