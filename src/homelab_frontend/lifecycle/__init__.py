"""Managed backends: the gateway starts, swaps and stops the servers it fronts (`run:` in the config).

`policy.py` decides (pure: states, what to start, what to drain and stop, when); `process.py`
and `probe.py` perform (spawn in its own process group with a parent-death signal, one SIGTERM
then SIGKILL, readiness, vLLM sleep/wake); `gate.py` is the admission side (the queue a request
waits in while its backend loads or waits for room); `fleet.py` ties them together.
"""
