"""The simulated engine: stands in for the GPU server, with vLLM's API and metric names."""
