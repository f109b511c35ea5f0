"""How a gateway process puts the adapter store together from its settings.

In one process the engine is wrapped so that it fetches by hash from the store into
`--adapter-cache-dir` (with the default local store the two are one directory and nothing
is copied). With Ray Serve replicas the ingress only writes and deletes objects; each
replica wraps its own engine (gateway/replicas/engine_replica.py) with its own cache.
"""

from __future__ import annotations

from pathlib import Path

from loragate.adapters.store import AdapterFetcher, open_store
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.objects import AdapterObjects
from loragate.gateway.adapter_control.store_engine import StoreBackedEngine
from loragate.gateway.adapter_control.uploads import AdapterUploads, default_max_adapter_bytes
from loragate.gateway.store_seam import StoreSeam

# How often a deployment's own store is swept of objects no name uses (left by a crash, or
# a deletion while the registry was unreachable); the first sweep runs at start.
SWEEP_EVERY_S = 600.0


def cache_dir_of(settings, replica: str = "local") -> Path:
    return Path(str(settings.adapter_cache_dir).replace("{replica}", replica)).expanduser()


def with_adapter_store(settings, engine, registry: StoreSeam, in_process: bool):
    """(the engine the gateway uses, its AdapterObjects)."""
    cache = cache_dir_of(settings)
    store = open_store(settings.adapter_store, cache)
    fetcher = AdapterFetcher(store, cache) if in_process else None
    if fetcher is not None:
        engine = StoreBackedEngine(engine, fetcher)
    staging = cache / "staging"
    owned = settings.adapter_store is not None  # a store chosen for this deployment
    objects = AdapterObjects(
        registry,
        store,
        fetcher,
        staging,
        import_folders=owned,
        sweep_every_s=SWEEP_EVERY_S if owned else None,
    )
    return engine, objects


def adapter_uploads(settings, manager: AdapterManager, objects: AdapterObjects) -> AdapterUploads:
    model = manager.engine.model_info
    limit = settings.max_adapter_bytes or default_max_adapter_bytes(
        model.lora_spec, model.max_lora_rank
    )
    return AdapterUploads(
        manager,
        objects,
        cache_dir_of(settings) / "staging",
        limit,
        strict_base_model=settings.engine.strict_lora_base_model,
    )
