"""Who may do what and where it goes: client keys, request limits, model routing and session affinity."""
