"""One request in flight: the exchange (slot + upstream response), its watchdog, the request record, the context clamp."""
