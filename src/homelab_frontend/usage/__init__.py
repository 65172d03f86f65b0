"""Who used the GPUs: the usage ledger (per key x model x hour) and token budgets per key.

`record.py` reads one finished request off its record; `rollup.py` sums requests into hourly
rows and rows into a query's answer; `budgets.py` judges a key against its budget;
`sqlite_store.py` (default) and `redis_store.py` (with `cluster:`) keep the rows and the
counts; `ledger.py` is what the gateway calls. Fed only by `Gateway.observe`, so every surface
counts the same way.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
