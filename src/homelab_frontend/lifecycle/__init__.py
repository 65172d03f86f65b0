"""Managed backends: the gateway starts, swaps and stops the servers it fronts (`run:` in the config).

`policy.py` decides (pure: states, what to start, what to drain and stop, when); `process.py`
and `probe.py` perform (spawn under `supervisor.py`, which ends the server's whole process tree
when the gateway dies; one SIGTERM then SIGKILL; readiness, vLLM sleep/wake); `fleet.py` ties
them together. Admission is the slot
pool's one queue (admission/slots.py): the fleet sets a gate on a managed backend's queue (what
the policy admits now) and pauses its clock while the backend loads.
"""
