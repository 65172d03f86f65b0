"""The gateway's benchmark: `python -m bench.run` (see run.py)."""
