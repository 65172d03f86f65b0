"""Token budgets per key (`auth.keys[].budget`): what a key has used in the current UTC day and
month, and the refusal once it is past either. Pure; the stores keep the counts.

Counted: input + output tokens (the prompt's cached part included, as the backend reports
prompt_tokens), added as each request finishes. So a request is judged at admission on what had
finished before it, and a request already running is never cut: the overshoot is at most what
the requests admitted before the budget ran out go on to use. Estimated figures (record.py)
count like exact ones.
"""

from __future__ import annotations

from .. import config as cfgmod
from ..errors import GatewayError
from .windows import DAY, day_start, iso, month_start, next_month_start

DAY_WINDOW, MONTH_WINDOW = "d", "m"


def limits_of(auth: cfgmod.Auth) -> dict[str, cfgmod.Budget]:
    return {k.name: k.budget for k in auth.keys
            if k.budget is not None and (k.budget.tokens_per_day or k.budget.tokens_per_month)}


_month_of_day: dict[int, int] = {}


def windows(now: float) -> tuple[int, int]:
    """(the UTC day's start, the UTC month's start) at `now`. Once per request: the month is
    looked up by day (gmtime and timegm cost microseconds)."""
    day = int(now // DAY) * DAY
    month = _month_of_day.get(day)
    if month is None:
        if len(_month_of_day) > 64:
            _month_of_day.clear()
        month = _month_of_day[day] = month_start(day)
    return day, month


def refusal(name: str, budget: cfgmod.Budget, used_day: int, used_month: int, now: float) -> GatewayError | None:
    """The 429 for a key past a budget, Retry-After the seconds until the (latest) exceeded window
    resets: a key past its month waits for the month, however far."""
    over = []
    if budget.tokens_per_day is not None and used_day >= budget.tokens_per_day:
        over.append(("tokens_per_day", used_day, budget.tokens_per_day, day_start(now) + DAY))
    if budget.tokens_per_month is not None and used_month >= budget.tokens_per_month:
        over.append(("tokens_per_month", used_month, budget.tokens_per_month, next_month_start(now)))
    if not over:
        return None
    field, used, limit, reset = max(over, key=lambda o: o[3])
    return GatewayError(
        "rate_limit",
        f"key {name!r} has used {used} tokens of its budget of {limit} ({field}, UTC); "
        f"it resets at {iso(reset)}",
        retry_after=max(1.0, reset - now),
    )


def status(name: str, budget: cfgmod.Budget, used_day: int, used_month: int, now: float) -> dict:
    """One key's budget use, for /admin/usage and the dashboard."""
    return {
        "key": name,
        "tokens_per_day": budget.tokens_per_day, "used_today": used_day,
        "day_resets": iso(day_start(now) + DAY),
        "tokens_per_month": budget.tokens_per_month, "used_this_month": used_month,
        "month_resets": iso(next_month_start(now)),
        "exhausted": refusal(name, budget, used_day, used_month, now) is not None,
    }
