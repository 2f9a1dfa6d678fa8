"""Version of the bundled HiSparse kernel module (read by setup.py and by the harness as text)."""

__version__ = "0.1.0"
