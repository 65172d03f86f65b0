"""How the suite is split across pytest-xdist workers (`make test` runs `-n N --dist loadgroup`).

One rule: a work unit is an xdist group, and every test belongs to one.
- A test marked `pytest.mark.xdist_group("name")` keeps its mark: the session-wide vLLM server's
  tests carry `xdist_group("vllm")`, so one worker starts it once.
- A test using a session-wide real server fixture listed in SHARED_SERVERS joins that server's
  group (the fixture is then started once, on one worker, and the server is not started once per
  worker on a 2-core machine).
- Every other test gets its module's path as its group, so a module's fixtures (a module-scoped
  gateway, a stub) start once and its tests run in file order, on one worker, as they do serially.

And one order: the controller hands out the groups slowest first, so a long module (a real
server's start and its tests) is not the last one started while the other workers idle. The
seconds are the previous run's, from pytest's cache; a fresh clone (CI) has none, so it takes
GROUP_SECONDS, a measured run's figures kept beside this file (`python tests/xdist_groups.py`
writes them from the cache after a `make test`); a group neither knows goes first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# session-scoped fixture name -> group: a real server that every test using it shares
SHARED_SERVERS = {"llama": "llama", "vllm": "vllm"}
CACHE_KEY = "homelab-frontend/xdist-group-seconds"
GROUP_SECONDS = Path(__file__).with_name("xdist_group_seconds.json")


def group_of(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return mark.args[0] if mark.args else mark.kwargs.get("name", "default")
    info = getattr(item, "_fixtureinfo", None)
    for name, group in SHARED_SERVERS.items():
        defs = info.name2fixturedefs.get(name) if info is not None else None
        # a module may define its own `llama` (another size): only the session-wide one is shared
        if defs and defs[-1].scope == "session":
            return group
    return item.nodeid.split("::", 1)[0]


def assign(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item)))


def split_scope(nodeid: str) -> str:
    """The group in a test id: xdist's own form `path::name[params]@group`, or the form
    suffix_nodeids writes, `path::name@group[params]`; an id without one is its own group."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    head = nodeid.partition("[")[0]
    last = head.rsplit("::", 1)[-1]
    if "::" in head and "@" in last:
        return last.rsplit("@", 1)[1]
    return nodeid


def suffix_nodeids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker, after xdist's own hook: each test's id carries its group, which is how the
    controller's scheduler sees it. xdist 3.8 writes `item._nodeid`, which pytest 9.2 no longer
    reads (its id is `item._id`, a parsed NodeId), so the groups were silently ignored: done here
    for the tests it missed, as `path::name@group[params]`, a form pytest's NodeId parses back to
    the same string (`...[params]@group` comes back with a `]` added at its end)."""
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    for item in items:
        nodeid = item.nodeid
        if split_scope(nodeid) != nodeid:
            continue  # xdist did it
        group = group_of(item)
        bracket = nodeid.find("[", nodeid.rfind("::"))
        want = f"{nodeid}@{group}" if bracket < 0 else f"{nodeid[:bracket]}@{group}{nodeid[bracket:]}"
        item._nodeid = want
        if item.nodeid != want:
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(want)
        assert item.nodeid == want and split_scope(want) == group, (item.nodeid, want)


class NodeIdSuffix:
    @pytest.hookimpl(trylast=True)  # after xdist's own hook
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        suffix_nodeids(config, items)


def make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadGroupScheduling

    cache = getattr(config, "cache", None)  # none with -p no:cacheprovider
    seconds: dict[str, float] = {**kept_seconds(), **(cache.get(CACHE_KEY, {}) if cache is not None else {})}

    class SlowestFirst(LoadGroupScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # the first assignment comes after the work queue is filled: order it once, then
            if not self._ordered:
                self._ordered = True
                queue = sorted(self.workqueue.items(), key=lambda kv: -seconds.get(kv[0], float("inf")))
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return SlowestFirst(config, log)


class GroupClock:
    """On the controller: adds up each group's test time and stores it for the next run's order."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        group = split_scope(report.nodeid)
        if group == report.nodeid:
            group = report.nodeid.split("::", 1)[0]
        self.seconds[group] = self.seconds.get(group, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds and getattr(self.config, "cache", None) is not None:
            known = self.config.cache.get(CACHE_KEY, {})
            known.update({g: round(s, 2) for g, s in self.seconds.items()})
            self.config.cache.set(CACHE_KEY, known)


def kept_seconds() -> dict[str, float]:
    try:
        return json.loads(GROUP_SECONDS.read_text())
    except (OSError, ValueError):
        return {}


def keep_cached_seconds(root: Path) -> int:
    """Writes GROUP_SECONDS from the cache of the last run at `root` (its slowest groups matter;
    the rest are kept too, rounded, so that a new module is the only unknown)."""
    cached = root / ".pytest_cache" / "v" / CACHE_KEY
    seconds = json.loads(cached.read_text())
    GROUP_SECONDS.write_text(json.dumps({g: round(s, 1) for g, s in sorted(seconds.items())}, indent=0) + "\n")
    return len(seconds)


if __name__ == "__main__":
    print(f"{keep_cached_seconds(Path(__file__).resolve().parents[1])} groups written to {GROUP_SECONDS}")
