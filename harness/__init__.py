"""Reproduction and benchmark harness for vLLM's Hybrid HiSparse on GLM-5.3."""

__version__ = "0.1.0"
