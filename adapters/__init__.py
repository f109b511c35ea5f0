"""loragate.adapters: PEFT LoRA adapters, validated, kept in a CPU tier and device slots."""

from loragate.adapters.errors import (
    AdapterChangedError,
    AdapterConfigError,
    AdapterError,
    AdapterLoadTimeoutError,
    AdapterNotFoundError,
    AdapterNotInMemory,
    AdapterRankError,
    AdapterShapeError,
    AdapterTooLargeError,
    BaseModelMismatchError,
    BaseModelMismatchWarning,
    CorruptWeightsError,
    PickleWeightsError,
    UnsupportedAdapterError,
    UnsupportedTargetModuleError,
)
from loragate.adapters.eviction import lru_victim
from loragate.adapters.identity import WeightsIdentity
from loragate.adapters.loader import LoRAAdapter, load_adapter
from loragate.adapters.pacing import LoadPacing, LoadWindows
from loragate.adapters.request import LoRARequest
from loragate.adapters.spec import LoRAModelSpec

__all__ = [
    "AdapterChangedError",
    "AdapterConfigError",
    "AdapterError",
    "AdapterLoadTimeoutError",
    "AdapterNotInMemory",
    "AdapterNotFoundError",
    "AdapterRankError",
    "AdapterShapeError",
    "AdapterTooLargeError",
    "BaseModelMismatchError",
    "BaseModelMismatchWarning",
    "CorruptWeightsError",
    "LoRAAdapter",
    "LoRAModelSpec",
    "LoRARequest",
    "PickleWeightsError",
    "UnsupportedAdapterError",
    "UnsupportedTargetModuleError",
    "WeightsIdentity",
    "load_adapter",
    "LoadPacing",
    "LoadWindows",
    "lru_victim",
]
