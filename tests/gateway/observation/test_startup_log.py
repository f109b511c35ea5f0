"""The server says what it serves before it listens, one line per item, in order; uvicorn's
INFO lines are not labelled `uvicorn.error`. Bounded metric labels keep their names."""

from __future__ import annotations

import logging

from gateway_testlib import ENGINE
from servers_testlib import start_tiny_server

from loragate.gateway.observation.labels import BASE, OTHER, BoundedLabels

ORDER = (
    "model:",
    "dtype:",
    "weights:",
    "device:",
    "threads:",
    "KV cache:",
    "max_model_len:",
    "LoRA:",
    "prefix caching:",
    "plugins:",
    "registry:",
)


def test_the_startup_lines_come_in_order_before_the_server_listens(tiny_dir, caplog):
    caplog.set_level(logging.INFO)
    server = start_tiny_server(tiny_dir, {"plugins": ("gateway_test_plugin:RunnerUpPlugin",)})
    server.stop()
    records = caplog.records
    startup = [r.getMessage() for r in records if r.name == "loragate.startup"]
    assert [line.split(" ")[0] for line in startup] == [o.split(" ")[0] for o in ORDER]
    for line, prefix in zip(startup, ORDER, strict=True):
        assert line.startswith(prefix), (line, prefix)
    by_prefix = {prefix: line for line, prefix in zip(startup, ORDER, strict=True)}
    blocks, size = ENGINE["num_kv_blocks"], ENGINE["block_size"]
    assert by_prefix["KV cache:"] == (
        f"KV cache: {blocks} blocks of {size} tokens ({blocks * size} tokens)"
    )
    assert by_prefix["dtype:"] == "dtype: float32 (auto: LORAGATE_CPU_BF16=0)"  # tests/conftest.py
    assert by_prefix["device:"] == "device: cpu"
    assert by_prefix["weights:"].startswith("weights: none: float32 ")  # a float base
    assert by_prefix["max_model_len:"].startswith(f"max_model_len: {ENGINE['max_model_len']},")
    assert f"{ENGINE['max_loras']} device slots" in by_prefix["LoRA:"]
    assert "RunnerUpPlugin" in by_prefix["plugins:"]
    assert by_prefix["registry:"] == "registry: in-memory (this process only)"
    # before it listens: the lifespan logs them, then the server listens and says where
    last_startup = max(i for i, r in enumerate(records) if r.name == "loragate.startup")
    said = "accepting connections on"
    listening = [i for i, r in enumerate(records) if r.getMessage().startswith(said)]
    assert listening and listening[0] > last_startup
    assert records[listening[0]].getMessage() == f"{said} {server.url}"
    assert not [r for r in records if r.name == "uvicorn.error" and r.levelno < logging.WARNING]


def test_the_first_names_keep_their_labels_and_later_ones_are_other():
    labels = BoundedLabels(2)
    assert [labels.label(n) for n in ("a", "b", "c", "a", BASE, "d", "b")] == [
        "a",
        "b",
        OTHER,
        "a",
        BASE,
        OTHER,
        "b",
    ]
    assert labels.named() == {"a", "b"}
    assert BoundedLabels(0).label("a") == OTHER
