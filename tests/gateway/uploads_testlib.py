"""Uploading an adapter over HTTP and reading back what it generates: shared by the upload,
adapter-store and Ray adapter-store tests."""

from __future__ import annotations

from pathlib import Path

import httpx
from tenancy_testlib import Api

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
N = 8  # tokens each generation asks for


def upload(api: Api, name: str, parts: dict[str, bytes], **fields) -> httpx.Response:
    files = {part: (part, data, "application/octet-stream") for part, data in parts.items()}
    data = {"name": name, **{k: str(v).lower() for k, v in fields.items()}}
    return api.request("POST", "/v1/adapters", files=files, data=data)


def parts_of(directory: Path) -> dict[str, bytes]:
    return {CONFIG: (directory / CONFIG).read_bytes(), WEIGHTS: (directory / WEIGHTS).read_bytes()}


def generated(api: Api, adapter: str) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy ids) of TGI's /generate with the adapter."""
    got = api.post(
        "/generate",
        {
            "inputs": "Hello world",
            "parameters": {
                "adapter_id": adapter,
                "max_new_tokens": N,
                "details": True,
                "decoder_input_details": True,
            },
        },
    )
    assert got.status_code == 200, got.text
    details = got.json()["details"]
    return [t["id"] for t in details["prefill"]], [t["id"] for t in details["tokens"]]
