"""Admission: the bounded fair queue in front of a backend's sequence slots, in process or leased through Redis."""
