"""Fixtures shared across test modules. The real vLLM-on-CPU sweep runs once per session (tests/cpu_vllm_run.py)."""

from cpu_vllm_run import cpu_vllm_run  # noqa: F401  (a session fixture: every module that asks shares one run)
