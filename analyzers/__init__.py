"""Trace analyzers: any Kineto trace in, one versioned JSON result out. Never imports torch."""
