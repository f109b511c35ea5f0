"""The base's quantization, said where operators and clients look (issue 59): the base's
card in /v1/models (method and bytes per tensor type), a /metrics gauge of the bytes held per
type labelled with the quantization, and the start log's weights line."""

from __future__ import annotations

import logging

import httpx
from gateway_testlib import metrics
from servers_testlib import start_tiny_server


def test_an_int4_base_says_so_in_models_metrics_and_the_start_log(tiny_dir, caplog):
    caplog.set_level(logging.INFO)
    server = start_tiny_server(tiny_dir, {"quantization": "int4"})
    try:
        cards = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
        scraped = metrics(server.url)
    finally:
        server.stop()
    base = next(card for card in cards if card["parent"] is None)
    quantization = base["quantization"]
    assert quantization["method"] == "int4"
    # the tiny model's rows: 64 weights (groups of 64) and 128 (down_proj: groups of 128)
    held = quantization["weight_bytes"]
    assert set(held) == {"I4_G64", "I4_G128", "float32"}
    name = base["id"]
    for kind, size in held.items():
        key = f'loragate_base_weight_bytes{{model_name="{name}",quantization="int4",type="{kind}"}}'
        assert scraped[key] == size
    lines = [r.getMessage() for r in caplog.records if r.name == "loragate.startup"]
    weights = next(line for line in lines if line.startswith("weights: "))
    assert weights.startswith("weights: int4: I4_G128 ") and "I4_G64" in weights
