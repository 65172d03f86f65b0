"""Images through the gateway, over real sockets, against the stub's stable-diffusion.cpp
flavour (stub/images.py follows sd-server's routes_openai.cpp): generations and edits as the
server answers them, the edit's images streamed in as an upload, the backend's refusals in
OpenAI's shape, one render at a time through the slot, a client that leaves while its image
renders stopping it, and the ledger's images."""

from __future__ import annotations

import base64
import json

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import start_stub, wait_for
from support.media_client import form, upload

KEY, ADMIN = "sk-img", "sk-admin-img"
ENV = {"KEY": KEY, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "ida", "key_env": "KEY"}], "admin_key_env": "ADMIN_KEY"}
H = {"authorization": f"Bearer {KEY}"}
HA = {"authorization": f"Bearer {ADMIN}"}
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")


@pytest.fixture(scope="module")
def sd():
    with start_stub("sdcpp") as s:
        yield s


@pytest.fixture(scope="module")
def gw(sd):
    cfg = config_for({"sd": {"url": sd.base, "kind": "openai", "slots": 1}},
                     {"sdxl": {"backend": "sd", "upstream_model": "sd-cpp-local", "capabilities": ["image"]}},
                     auth=AUTH)
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: g.admin(HA)["backends"]["sd"]["up"], 10)
        yield g


def test_generations_come_back_as_sd_server_made_them(gw, sd):
    status, headers, raw = post_raw(gw.url + "/llm/v1/images/generations",
                                    {"model": "sdxl", "prompt": "a red fox", "n": 2, "size": "64x32",
                                     "response_format": "b64_json"}, H)
    assert status == 200, raw
    doc = json.loads(raw)
    assert len(doc["data"]) == 2 and "model" not in doc  # sd-server names none: none is invented
    img = base64.b64decode(doc["data"][0]["b64_json"])
    assert img.startswith(b"\x89PNG") and int.from_bytes(img[16:20], "big") == 64
    assert sd.requests()[-1]["body"]["model"] == "sd-cpp-local"


def test_edits_are_uploaded_with_their_images(gw, sd):
    body, ctype = form([("model", "sdxl"), ("prompt", "make it blue")],
                       [("image[]", "in.png", PNG, "image/png"), ("mask", "m.png", PNG, "image/png")])
    status, _, raw = upload(gw.url + "/v1/images/edits", body, ctype, headers=H)
    assert status == 200, raw
    assert json.loads(raw)["data"][0]["b64_json"]
    sent = sd.requests()[-1]["body"]
    assert sent["model"] == "sd-cpp-local" and sent["files"]["image[]"][0]["bytes"] == len(PNG)


def test_an_edit_whose_prompt_comes_after_its_image(gw, sd):
    # JS FormData in append order: the image first, then the prompt (and model) after it
    body, ctype = form([("prompt", "make it blue"), ("model", "sdxl")], [("image", "in.png", PNG, "image/png")],
                       files_first=True)
    status, _, raw = upload(gw.url + "/v1/images/edits", body, ctype, headers=H)
    assert status == 200, raw
    assert sd.requests()[-1]["body"]["prompt"] == "make it blue"


def test_bad_input_and_the_servers_refusals(gw):
    status, _, raw = post_raw(gw.url + "/v1/images/generations", {"model": "sdxl"}, H)
    assert status == 400 and json.loads(raw)["error"]["param"] == "prompt"
    # an edit's form is read only to its image: whether a prompt follows is sd-server's to say
    body, ctype = form([("model", "sdxl")], [("image", "in.png", PNG, "image/png")])
    status, _, raw = upload(gw.url + "/v1/images/edits", body, ctype, headers=H)
    assert status == 400 and "prompt required" in json.loads(raw)["error"]["message"]
    body, ctype = form([("model", "sdxl"), ("prompt", "x")])
    status, _, raw = upload(gw.url + "/v1/images/edits", body, ctype, headers=H)
    assert status == 400 and json.loads(raw)["error"]["param"] == "image"
    status, _, raw = post_raw(gw.url + "/v1/images/generations", {"model": "sdxl", "prompt": "x", "size": "huge"}, H)
    assert status == 400 and "'sd'" in json.loads(raw)["error"]["message"]  # sd-server's own 400


def test_a_client_that_leaves_while_its_image_renders_stops_it(gw, sd):
    before = sd.log_text().count("cancelled")
    post_and_vanish(gw.url + "/v1/images/generations",
                    {"model": "sdxl", "prompt": "[stub steps=50 delay_ms=100] a slow castle"}, headers=H,
                    when=lambda: sd.stats()["in_flight"] == 1, after_s=0.2)
    wait_for(lambda: sd.log_text().count("cancelled") == before + 1, 2)
    wait_for(lambda: sd.stats()["in_flight"] == 0, 2)
    wait_for(lambda: gw.admin(HA)["backends"]["sd"]["in_use"] == 0, 2)
    rec = wait_for(lambda: [r for r in gw.access_log() if r["dialect"] == "images"
                            and r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["status"] == 499


def test_one_render_at_a_time_and_the_ledger_counts_images(gw, sd):
    import threading

    sd.reset()

    def images() -> int:
        return sum(r["images"] for r in gw.get("/admin/usage?model=sdxl", HA)[1]["rows"])

    before = images()
    statuses = []
    body = {"model": "sdxl", "prompt": "[stub steps=3 delay_ms=100] boats", "n": 1}
    threads = [threading.Thread(target=lambda: statuses.append(post_raw(gw.url + "/v1/images/generations",
                                                                         body, H)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: gw.admin(HA)["backends"]["sd"]["queued"] == 1, 10)
    for t in threads:
        t.join(30)
    assert statuses == [200, 200] and sd.stats()["max_in_flight"] == 1
    wait_for(lambda: images() == before + 2, 5)
