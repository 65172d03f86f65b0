"""The client dialects: each parses its requests into the canonical model and encodes canonical events back.

One package per dialect (openai/, anthropic/, responses/); the modules here are what they share:
the body check, the error status table, what every encoder does alike (assembly.py), the gateway view (context.py), the canonical event feed
from an upstream stream (upstream_events.py), model-name rewriting and thinking signatures.
"""
