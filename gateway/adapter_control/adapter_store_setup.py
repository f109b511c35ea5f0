"""How a gateway process puts the adapter store together from its settings: the store, the
fetcher an engine finds objects with, the AdapterObjects the gateway writes and deletes them
with, and the uploads.

In one process the engine fetches by hash from the store into `--adapter-cache-dir` (with
the default local store the two are one directory and nothing is copied): the app hands the
fetcher to the engine it starts (its adapter residency fetches, engine/lora/stored_adapters.py)
and from then on talks to the engine alone: AdapterObjects tells it of uploads and
deletions through its EngineClient. With Ray Serve replicas the ingress only writes and
deletes objects; each replica gives its own engine a fetcher of its own cache
(gateway/replicas/engine_replica.py). This is the one gateway module that names the fetcher
(tests/gateway/adapter_control/test_fetcher_owner.py).
"""

from __future__ import annotations

from pathlib import Path

from loragate.adapters.store import AdapterFetcher, open_store
from loragate.engine import EngineClient
from loragate.gateway.adapter_control.adapter_store_objects import AdapterObjects
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.uploads import AdapterUploads, default_max_adapter_bytes
from loragate.gateway.registry_seam import RegistrySeam

# How often a deployment's own store is swept of objects no name uses (left by a crash, or
# a deletion while the registry was unreachable); the first sweep runs at start.
SWEEP_EVERY_S = 600.0


def cache_dir_of(cache_dir, replica: str = "local") -> Path:
    """`--adapter-cache-dir` with `{replica}` in it made this replica's id."""
    return Path(str(cache_dir).replace("{replica}", replica or "local")).expanduser()


def adapter_fetcher(adapter_store: str | None, cache_dir, replica: str = "local") -> AdapterFetcher:
    """The fetcher of `--adapter-store` into `--adapter-cache-dir` (`{replica}` in it: this
    Ray Serve replica's id, so replicas on one machine keep separate caches)."""
    cache = cache_dir_of(cache_dir, replica)
    return AdapterFetcher(open_store(adapter_store, cache), cache)


def adapter_objects(settings, registry: RegistrySeam, engine: EngineClient) -> AdapterObjects:
    """The store's objects as this gateway keeps them, telling ``engine`` of those it writes
    and deletes (the in-process engine caches them; replicas fetch for themselves)."""
    cache = cache_dir_of(settings.adapter_cache_dir)
    store = open_store(settings.adapter_store, cache)
    owned = settings.adapter_store is not None  # a store chosen for this deployment
    return AdapterObjects(
        registry,
        store,
        engine,
        cache / "staging",
        import_folders=owned,
        sweep_every_s=SWEEP_EVERY_S if owned else None,
    )


def adapter_uploads(settings, manager: AdapterManager, objects: AdapterObjects) -> AdapterUploads:
    model = manager.engine.model_info
    limit = settings.max_adapter_bytes or default_max_adapter_bytes(
        model.lora_spec, model.max_lora_rank
    )
    return AdapterUploads(
        manager,
        objects,
        cache_dir_of(settings.adapter_cache_dir) / "staging",
        limit,
        strict_base_model=settings.engine.strict_lora_base_model,
    )
