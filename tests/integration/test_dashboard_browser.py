"""The dashboard at GET / in a real headless browser (Debian's chromium, driven by Selenium
through Debian's chromedriver): it asks for the admin key, then shows every backend with the
numbers /admin/requests gives, a running request appears (with the endpoint it came in on and its
client's address) and disappears, the cancel button really cancels upstream, and finished
requests show with their endpoint, TTFT and outcome."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import standard_config
from gwproc import Gateway
from rawhttp import post_raw
from stubproc import free_port, wait_for

pytestmark = pytest.mark.real  # chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1100",
)
ADMIN_KEY = "dash-admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        why = f"needs {', '.join(missing)}: run .ci/deps/chromium.sh"
        if os.environ.get("CI"):
            pytest.fail(why)  # CI installs them: missing there is a broken setup, not a skip
        pytest.skip(why)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver, predicate, timeout: float = 10.0):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: predicate())


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def text(driver, selector: str) -> str | None:
    found = css(driver, selector)
    return found[0].text if found else None


def card_numbers(driver) -> dict[str, dict]:
    """What the backend cards show, read in one script run (the page redraws them every poll)."""
    return driver.execute_script("""
        const out = {};
        for (const c of document.querySelectorAll("#backends .backend")) {
          const n = (cls) => Number(c.querySelector("." + cls).textContent);
          out[c.dataset.backend] = {in_use: n("in-use"), slots: n("slots"), queued: n("queued"),
                                    up: c.dataset.up === "true"};
        }
        return out;""")


def admin_numbers(gw: Gateway) -> dict[str, dict]:
    return {name: {k: b[k] for k in ("in_use", "slots", "queued", "up")}
            for name, b in gw.admin(ADMIN)["backends"].items()}


def stream(gw: Gateway, prompt: str):
    return post_raw(gw.base + "/chat/completions",
                    {"model": "reasoning", "stream": True, "messages": [{"role": "user", "content": prompt}]})


def running_ids(gw: Gateway) -> list[str]:
    return [r["id"] for r in gw.admin(ADMIN)["requests"]]


def test_dashboard_shows_backends_requests_and_cancels(browser, vllm_stub, ollama_stub, stubs):
    cfg = standard_config(vllm_stub.base, ollama_stub.base, auth={"admin_key_env": "HLF_DASH_ADMIN"})
    # a third backend nobody listens for: the page must show it down
    cfg["backends"]["spare"] = {"url": f"http://127.0.0.1:{free_port()}/v1", "health_interval_s": 0.2,
                                "timeouts": {"connect_s": 1}}
    with Gateway(cfg, env={"HLF_DASH_ADMIN": ADMIN_KEY}) as gw, ThreadPoolExecutor(2) as pool:
        browser.get(gw.url + "/")
        assert browser.title == "homelab-frontend"
        until(browser, lambda: browser.find_element("tag name", "body").get_attribute("data-state") == "auth")
        assert text(browser, "#status") == "admin key required"

        css(browser, "#key")[0].send_keys(ADMIN_KEY)
        css(browser, "#usekey")[0].click()
        until(browser, lambda: browser.find_element("tag name", "body").get_attribute("data-state") == "live")

        # every backend, with the numbers the admin API gives
        until(browser, lambda: card_numbers(browser).get("spare", {}).get("up") is False)
        assert card_numbers(browser) == admin_numbers(gw)
        shown = card_numbers(browser)
        assert shown["gpu0"] == {"in_use": 0, "slots": 8, "queued": 0, "up": True}
        assert shown["ollama"] == {"in_use": 0, "slots": 4, "queued": 0, "up": True}
        assert "connection refused" in text(browser, '.backend[data-backend="spare"] .errline')

        # a long request appears with its model, backend and phase; the slot bar fills
        cancelled_before = vllm_stub.log_text().count("cancelled")
        long = pool.submit(stream, gw, "[stub content=500 delay_ms=20]")
        rid = wait_for(lambda: running_ids(gw), 5)[0]
        row = f'#inflight tr[data-id="{rid}"]'
        until(browser, lambda: text(browser, f"{row} .phase") == "streaming")
        assert text(browser, f"{row} .model") == "reasoning"
        assert text(browser, f"{row} .backend") == "gpu0"
        # the endpoint it came in on, and its client's address
        assert text(browser, f"{row} .endpoint") == "/llm/v1/chat/completions"
        assert text(browser, f"{row} .client") == "127.0.0.1"
        until(browser, lambda: card_numbers(browser)["gpu0"]["in_use"] == 1)
        assert card_numbers(browser) == admin_numbers(gw)  # the stream runs for 10 s: steady
        assert len(css(browser, "#inflight tr")) == len(gw.admin(ADMIN)["requests"]) == 1
        assert len(css(browser, '.backend[data-backend="gpu0"] .bar i.used')) == 1
        until(browser, lambda: int(text(browser, f"{row} .tokens")) > 0)
        until(browser, lambda: (text(browser, "#rate-now") or "").endswith("tok/s now")
              and not text(browser, "#rate-now").startswith("0 "))

        # the cancel button cancels it upstream; the row goes, the recent list says how it ended
        css(browser, f"{row} button.cancel")[0].click()
        status, _, raw = long.result(timeout=10)
        assert status == 200 and b"cancelled by the gateway's operator" in raw
        wait_for(lambda: vllm_stub.log_text().count("cancelled") == cancelled_before + 1, 2)
        until(browser, lambda: not css(browser, row))
        until(browser, lambda: css(browser, f'#recent tr[data-id="{rid}"]'))
        assert text(browser, f'#recent tr[data-id="{rid}"] .outcome') == "error api error"

        # a request that finishes by itself appears, then disappears into the recent list
        short = pool.submit(stream, gw, "[stub content=150 delay_ms=20]")
        rid = wait_for(lambda: running_ids(gw), 5)[0]
        until(browser, lambda: css(browser, f'#inflight tr[data-id="{rid}"]'))
        assert short.result(timeout=10)[0] == 200
        until(browser, lambda: not css(browser, f'#inflight tr[data-id="{rid}"]'))
        recent = f'#recent tr[data-id="{rid}"]'
        until(browser, lambda: css(browser, recent))
        assert text(browser, f"{recent} .outcome") == "ok"
        assert text(browser, f"{recent} .endpoint") == "/llm/v1/chat/completions"
        assert text(browser, f"{recent} .client") == "127.0.0.1"
        rec = next(r for r in gw.get("/admin/stats", ADMIN)[1]["recent"] if r["id"] == rid)
        assert rec["ttft_ms"] is not None and text(browser, f"{recent} .ttft").endswith(" ms")
        assert rec["tokens_out"] >= 150  # content plus the reasoning tokens
        assert text(browser, f"{recent} .tokens") == f"{rec['tokens_in']} / {rec['tokens_out']}"
        until(browser, lambda: card_numbers(browser)["gpu0"]["in_use"] == 0)
        assert card_numbers(browser) == admin_numbers(gw)
        until(browser, lambda: text(browser, "#total-requests") == "2")

        # the page ran clean: no script errors, no blocked (e.g. off-site) loads
        problems = [e["message"] for e in browser.get_log("browser")
                    if e["level"] == "SEVERE" and "status of 401" not in e["message"]]
        assert problems == []
        browser.save_screenshot(os.path.join(gw.dir, "dashboard.png"))


def _usage_bars(driver) -> list[dict]:
    return driver.execute_script("""
        const out = [];
        for (const svg of ["usage-keys", "usage-models"])
          for (const r of document.querySelectorAll("#" + svg + " rect"))
            out.push({chart: svg, group: r.dataset.group, start: Number(r.dataset.start), tokens: Number(r.dataset.tokens),
                      measure: r.dataset.measure});
        return out;""")


def test_dashboard_draws_usage_per_key_and_model_and_budget_use(browser, vllm_stub, ollama_stub, stubs):
    keys = [{"name": "alice", "key_env": "HLF_DASH_ALICE", "budget": {"tokens_per_day": 100000}},
            {"name": "bob", "key_env": "HLF_DASH_BOB"}]
    cfg = standard_config(vllm_stub.base, ollama_stub.base, auth={"admin_key_env": "HLF_DASH_ADMIN", "keys": keys})
    env = {"HLF_DASH_ADMIN": ADMIN_KEY, "HLF_DASH_ALICE": "sk-dash-alice", "HLF_DASH_BOB": "sk-dash-bob"}
    with Gateway(cfg, env=env) as gw:
        for key, model in (("sk-dash-alice", "reasoning"), ("sk-dash-alice", "qwen2.5:3b-instruct"),
                           ("sk-dash-bob", "reasoning")):
            status, _, _ = post_raw(gw.base + "/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "[stub content=5] usage"}]},
                {"authorization": f"Bearer {key}"})
            assert status == 200
        status, doc = gw.get("/admin/usage?by=hour", ADMIN)
        want_key: dict[str, int] = {}
        want_model: dict[str, int] = {}
        for r in doc["rows"]:
            want_key[r["key"]] = want_key.get(r["key"], 0) + r["input_tokens"] + r["output_tokens"]
            want_model[r["model"]] = want_model.get(r["model"], 0) + r["input_tokens"] + r["output_tokens"]
        assert set(want_key) == {"alice", "bob"}

        browser.get(gw.url + "/")
        browser.execute_script(f"sessionStorage.setItem('hlf-admin-key', {ADMIN_KEY!r})")
        browser.refresh()
        browser.get_log("browser")  # what the previous test's page said is not this one's
        until(browser, lambda: css(browser, "#usage") and css(browser, "#usage")[0].is_displayed())
        # the last day, by hour: a bar per key and per model, as tall as the ledger says
        until(browser, lambda: len(_usage_bars(browser)) >= 4)
        bars = _usage_bars(browser)
        per_key = {g: sum(b["tokens"] for b in bars if b["chart"] == "usage-keys" and b["group"] == g) for g in want_key}
        per_model = {g: sum(b["tokens"] for b in bars if b["chart"] == "usage-models" and b["group"] == g) for g in want_model}
        assert per_key == want_key and per_model == want_model
        assert all(b["start"] % 3600 == 0 for b in bars)
        # the budget's use; bob has none
        row = '#budgets tr[data-key="alice"]'
        until(browser, lambda: text(browser, row) is not None)
        assert f"{want_key['alice']} / 100000" in text(browser, row)
        assert not css(browser, '#budgets tr[data-key="bob"]')
        # the last week, by day
        css(browser, '#usage button[data-range="week"]')[0].click()
        until(browser, lambda: (bs := _usage_bars(browser)) and all(b["start"] % 86400 == 0 for b in bs))
        assert sum(b["tokens"] for b in _usage_bars(browser) if b["chart"] == "usage-keys") == sum(want_key.values())
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and gw.url in e["message"]
                or e["source"] in ("javascript", "security")]
        assert not logs, logs  # no CSP violation, no script error


def test_dashboard_charts_the_relayed_calls_units(browser):
    """Rerank, speech and images are charted in their own units (documents, characters, images),
    switched with the measure buttons; the totals table names them."""
    from stubproc import start_stub

    with start_stub("kokoro") as kokoro, start_stub("vllm", "--model", "rr-up") as vllm, start_stub("sdcpp") as sd:
        cfg = {"backends": {"k": {"url": kokoro.base, "kind": "openai"}, "v": {"url": vllm.base, "kind": "vllm"},
                            "sd": {"url": sd.base, "kind": "openai"}},
               "models": {"tts-1": {"backend": "k", "upstream_model": "kokoro"},
                          "rr": {"backend": "v", "upstream_model": "rr-up"},
                          "sd": {"backend": "sd", "upstream_model": "sd-cpp-local"}},
               "auth": {"admin_key_env": "HLF_DASH_ADMIN"}}
        with Gateway(cfg, env={"HLF_DASH_ADMIN": ADMIN_KEY}) as gw:
            wait_for(lambda: all(b["up"] for b in gw.admin(ADMIN)["backends"].values()), 10)
            assert post_raw(gw.url + "/v1/audio/speech", {"model": "tts-1", "input": "twelve chars"})[0] == 200
            assert post_raw(gw.url + "/v1/rerank", {"model": "rr", "query": "q", "documents": ["a", "b", "c"]})[0] == 200
            assert post_raw(gw.url + "/v1/images/generations", {"model": "sd", "prompt": "x", "n": 2,
                                                                "size": "8x8"})[0] == 200
            wait_for(lambda: sum(r["images"] for r in gw.get("/admin/usage", ADMIN)[1]["rows"]) == 2, 5)

            browser.get(gw.url + "/")
            browser.execute_script(f"sessionStorage.setItem('hlf-admin-key', {ADMIN_KEY!r})")
            browser.refresh()
            browser.get_log("browser")
            until(browser, lambda: css(browser, "#usage") and css(browser, "#usage")[0].is_displayed())
            for measure, model, want in (("characters", "tts-1", 12), ("documents", "rr", 3), ("images", "sd", 2)):
                css(browser, f'#usage button[data-measure="{measure}"]')[0].click()
                until(browser, lambda: (bs := _usage_bars(browser)) and all(
                    b["measure"] == measure for b in bs))
                bars = [b for b in _usage_bars(browser) if b["chart"] == "usage-models"]
                assert {b["group"] for b in bars} == {model} and sum(b["tokens"] for b in bars) == want
            row = '#usage-totals tr[data-model="rr"] td.units'
            until(browser, lambda: text(browser, row) == "3 documents")
            logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"
                    or e["source"] in ("javascript", "security")]
            assert not logs, logs


def test_dashboard_shows_managed_backend_states_and_starts_and_stops_them(browser):
    from managed import alive, backends, stub_backend, wait_gone

    cfg = {"resources": {"gpu": 1}, "backends": {"coder": stub_backend("vllm", "--start-delay-s", "0.5")},
           "models": {"m": {"backend": "coder"}}, "auth": {"admin_key_env": "HLF_DASH_ADMIN"}}
    with Gateway(cfg, env={"HLF_DASH_ADMIN": ADMIN_KEY}) as gw:
        browser.get(gw.url + "/")
        until(browser, lambda: browser.execute_script("return document.body.dataset.state") == "auth")
        css(browser, "#key")[0].send_keys(ADMIN_KEY)
        css(browser, "#usekey")[0].click()
        card = '.backend[data-backend="coder"]'
        until(browser, lambda: text(browser, f"{card} .state") == "stopped")
        assert text(browser, f"{card} button.lc-act") == "start"
        css(browser, f"{card} button.lc-act")[0].click()
        until(browser, lambda: text(browser, f"{card} .state") == "ready", 30)
        pid = backends(gw, ADMIN)["coder"]["pid"]
        assert alive(pid) and text(browser, f"{card} .pid") == f"pid {pid}"
        until(browser, lambda: text(browser, f"{card} button.lc-act") == "stop")
        css(browser, f"{card} button.lc-act")[0].click()
        until(browser, lambda: text(browser, f"{card} .state") == "stopped", 30)
        wait_gone(pid)


def test_dashboard_groups_a_fronts_boxes_with_their_state(browser):
    """A front (docs/several-boxes.md): each box a group with its state and models around its
    backends here (`box1/gpu0`); one box nobody listens for, one that answers and is then stopped."""
    from conftest import R1
    from stubproc import start_stub

    env = {"HLF_DASH_ADMIN": ADMIN_KEY, "HLF_PEER_KEY": "sk-dash-front"}
    box_cfg = {"backends": {"gpu0": {"url": "", "kind": "vllm", "slots": 3, "health_interval_s": 0.5}},
               "models": {"r1": {"backend": "gpu0", "upstream_model": R1}},
               "auth": {"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}]}}
    front_cfg = {"backends": {
        "box1": {"url": "", "kind": "peer", "api_key_env": "HLF_PEER_KEY", "health_interval_s": 0.3},
        "box2": {"url": f"http://127.0.0.1:{free_port()}/llm/v1", "kind": "peer", "api_key_env": "HLF_PEER_KEY",
                 "health_interval_s": 0.3, "timeouts": {"connect_s": 1}}},
        "auth": {"admin_key_env": "HLF_DASH_ADMIN"}}
    group1, group2 = '.boxgroup[data-box="box1"]', '.boxgroup[data-box="box2"]'
    with start_stub("vllm", "--model", R1) as stub:
        box_cfg["backends"]["gpu0"]["url"] = stub.base
        box = Gateway(box_cfg, env=env).__enter__()
        try:
            front_cfg["backends"]["box1"]["url"] = box.base
            with Gateway(front_cfg, env=env) as front:
                browser.get(front.url + "/")
                until(browser, lambda: browser.execute_script("return document.body.dataset.state") == "auth")
                css(browser, "#key")[0].send_keys(ADMIN_KEY)
                css(browser, "#usekey")[0].click()
                until(browser, lambda: text(browser, f'{group1} .box-model[data-model="r1"]') == "r1 loaded", 15)
                assert text(browser, f"{group1} .box-state") == "reachable"
                assert text(browser, f"{group1} .box-poll").startswith("last poll ")
                # the box's backend is a card inside its group, with the box's own slots
                assert card_numbers(browser)["box1/gpu0"] == {"in_use": 0, "slots": 3, "queued": 0, "up": True}
                assert len(css(browser, f'{group1} .backend[data-backend="box1/gpu0"]')) == 1
                assert not css(browser, '.backend[data-backend="box1"]')  # the box is its group, not a card
                until(browser, lambda: text(browser, f"{group2} .box-state") == "unreachable")
                assert text(browser, f"{group2} .box-answer") == "never answered"
                assert "box2" in (text(browser, f"{group2} .errline") or "")

                box.__exit__(None, None, None)  # box1 goes away: unreachable, its models gone
                box = None
                until(browser, lambda: text(browser, f"{group1} .box-state") == "unreachable", 15)
                until(browser, lambda: (text(browser, f"{group1} .box-answer") or "").startswith("last answered "))
                assert not css(browser, f"{group1} .box-model")
                until(browser, lambda: card_numbers(browser)["box1/gpu0"]["up"] is False)
        finally:
            if box is not None:
                box.__exit__(None, None, None)
