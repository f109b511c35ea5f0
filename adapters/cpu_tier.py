"""The CPU tier: adapters read from disk and kept in CPU memory, by the weights' content.

Keyed by ``WeightsIdentity`` (adapters/identity.py), never by a request's name, id or path:
files that change are a new entry, and two names with the same files share one. Its reads
go through the engine's IdentityBook: a stat vouches for files unchanged since they were
hashed, and what the adapter store's checks hashed spares the hash of files still stamped as
they were then (adapters/loader.py). It holds at most ``max_cpu_loras`` adapters and its
byte budget (adapters/tier_budget.py); old weights age out as the eviction plugin chooses
(least recently used by default), except weights admitted requests hold (``hold`` /
``release``), which never leave it for another request's weights.

A plain object, not locked: the engine's AdapterResidency (engine/lora/adapter_residency.py)
is its one owner and calls it under its lock, all but ``read``, which changes nothing here.

Counters (``counts()``):
  cpu_hits         the CPU tier had the adapter (acquire miss or preload)
  disk_loads       adapters read and validated from disk into the CPU tier (misses)
  file_reads       adapter directories read (hashed, unless a stat vouched for them)
  vouched_reads    of those, read without hashing them again because a stat vouched
                   for the files: weights read back for requests admitted under them, or
                   a store object's files as the fetch that checked them left them
  cpu_evictions    adapters dropped from the CPU tier to respect max_cpu_loras
  load_seconds     time spent in disk loads
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch

from loragate.adapters.eviction import ChooseVictim, chosen_victim
from loragate.adapters.identity import IdentityBook, Vouch, WeightsIdentity
from loragate.adapters.loader import LoRAAdapter, load_adapter
from loragate.adapters.pacing import LoadPacing
from loragate.adapters.read_buffers import ReadBuffers
from loragate.adapters.request import LoRARequest
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.tier_budget import TierBudget, cpu_bytes, largest_bytes, unit_bytes
from loragate.adapters.usage import UsageBook

COUNTERS = ("cpu_hits", "disk_loads", "file_reads", "vouched_reads", "cpu_evictions")


class CpuTier:
    """Weights in CPU memory by identity, their bytes, the holds on them, and the reads that
    bring them in. ``stack_dtype`` is what the device slots read stacks in
    (DeviceSlots.stack_dtype); ``pin_memory`` where slots copy them beside the step (a GPU)."""

    def __init__(
        self,
        spec: LoRAModelSpec,
        *,
        max_cpu_loras: int,
        max_lora_rank: int,
        stack_dtype: torch.dtype,
        pin_memory: bool,
        book: IdentityBook,
        choose_victim: ChooseVictim,
        strict_base_model: bool = False,
        max_cpu_lora_bytes: int | None = None,
    ):
        self.spec = spec
        self.max_lora_rank = max_lora_rank
        self.strict_base_model = strict_base_model
        self.book = book  # its clock stamps the reads
        self._stack_dtype = stack_dtype
        self._pin_memory = pin_memory
        self._choose_victim = choose_victim
        # Stacks in the slots' dtype where slots borrow them or copy them beside the step (a
        # GPU), float32 otherwise; the vocabulary side is read into float32
        # (adapters/vocab_extras.py).
        self.budget = TierBudget.make(
            "CPU tier",
            max_cpu_loras,
            "max_cpu_loras",
            unit_bytes(spec, max_lora_rank, stack_dtype),
            largest_bytes(spec, max_lora_rank, stack_dtype, torch.float32),
            max_cpu_lora_bytes,
            "max_cpu_lora_bytes",
        )
        self._weights: dict[WeightsIdentity, LoRAAdapter] = {}
        self._bytes: dict[WeightsIdentity, int] = {}
        self._holds: Counter[WeightsIdentity] = Counter()
        self._read_buffers = ReadBuffers()  # weights files' reads reuse their memory
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._load_seconds = 0.0
        self._loads_of: dict[str, list] = {}  # sha256 -> [disk loads, their seconds]

    # -- what it holds ------------------------------------------------------------------
    def __contains__(self, identity: WeightsIdentity) -> bool:
        return identity in self._weights

    def get(self, identity: WeightsIdentity) -> LoRAAdapter | None:
        return self._weights.get(identity)

    def identities(self) -> list[WeightsIdentity]:
        """The weights held, oldest entry first."""
        return list(self._weights)

    def hit(self, identity: WeightsIdentity) -> LoRAAdapter | None:
        """``identity``'s weights, counted as a hit, if the tier holds them."""
        adapter = self._weights.get(identity)
        if adapter is not None:
            self._counters["cpu_hits"] += 1
        return adapter

    # -- holds: weights admitted requests still need ---------------------------------
    def hold(self, identity: WeightsIdentity) -> None:
        self._holds[identity] += 1

    def release(self, identity: WeightsIdentity) -> None:
        self._holds[identity] -= 1
        if self._holds[identity] <= 0:
            del self._holds[identity]

    def held(self, identity: WeightsIdentity) -> bool:
        return bool(self._holds.get(identity))

    def room_to_load(self, loading: int = 0) -> bool:
        """Whether weights may be read in for an admitted request now, with ``loading`` reads
        already under way: a place and bytes left beside the weights admitted requests hold."""
        held = [identity for identity in self._weights if self._holds.get(identity)]
        used = sum(self._bytes[identity] for identity in held)
        return len(held) + loading < self.budget.count and used < self.budget.limit

    # -- reads (no state of the tier changes) -----------------------------------------
    def read(
        self,
        request: LoRARequest,
        vouched: Vouch | None,
        pacing: LoadPacing,
    ) -> LoRAAdapter:
        """``request``'s files read and validated (paced by ``pacing``), not yet kept; an
        adapter larger than the whole tier is refused (AdapterTooLargeError)."""
        adapter = load_adapter(
            request.lora_path,
            self.spec,
            self.max_lora_rank,
            self.strict_base_model,
            pacing,
            # On a CPU the slots read the stacks in place, on a GPU copy them as they are.
            self._stack_dtype,
            vouched,
            self._read_buffers,
            # A GPU copies them into slots beside the step: from page-locked memory.
            pin_memory=self._pin_memory,
            clock=self.book.clock,
        )
        self.budget.check(request.lora_name, cpu_bytes(adapter), adapter.path)
        return adapter

    def count_read(self, vouched: bool) -> None:
        """A read ended (``vouched``: its files' hash was taken on a stat's word)."""
        self._counters["file_reads"] += 1
        self._counters["vouched_reads"] += vouched

    # -- keeping and dropping --------------------------------------------------------
    def insert(
        self,
        identity: WeightsIdentity,
        request: LoRARequest,
        adapter: LoRAAdapter,
        seconds: float,
        usage: UsageBook,
        slot_of: Mapping[WeightsIdentity, int],
        admitted: bool = False,
    ) -> list[WeightsIdentity]:
        """Keep ``adapter`` (read in ``seconds``), evicting weights no admitted request holds;
        the evicted. Where only held weights are left, an admitted request's load is kept past
        the bound (loads start only while there is room, so only loads already under way get
        here) and a read for admission is not kept: its request's own load reads it when there
        is room. Held weights never leave for another request's weights: they would be read
        again at their turn, and a burst over more adapters than the tier holds then read each
        many times over (the fleet check run: 1542 disk loads for 240 requests). ``usage`` and
        ``slot_of`` (the device tier's) describe the candidates to the eviction plugin."""
        self._counters["disk_loads"] += 1
        self._load_seconds += seconds
        row = self._loads_of.setdefault(identity.sha256, [0, 0.0])
        row[0] += 1
        row[1] += seconds
        size = cpu_bytes(adapter)
        evicted: list[WeightsIdentity] = []
        while not self.budget.fits(len(self._weights), sum(self._bytes.values()), size):
            droppable = [held for held in self._weights if not self._holds.get(held)]
            if not droppable and not admitted:
                return evicted
            if not droppable:
                break
            candidates = [usage.candidate(held, slot_of.get(held)) for held in droppable]
            key = chosen_victim(self._choose_victim, candidates, "cpu")
            victim = next(held for held in droppable if usage.key(held) == key)
            del self._weights[victim]
            del self._bytes[victim]
            evicted.append(victim)
            self._counters["cpu_evictions"] += 1
        self._weights[identity] = adapter
        self._bytes[identity] = size
        usage.sized(identity, request, adapter.size_bytes)
        return evicted

    def drop(self, identity: WeightsIdentity) -> bool:
        """Forget ``identity``'s weights unless an admitted request holds them; True if they
        were here and went."""
        if self._holds.get(identity):
            return False
        self._bytes.pop(identity, None)
        return self._weights.pop(identity, None) is not None

    # -- what it reports ----------------------------------------------------------------
    def counts(self) -> dict[str, float]:
        """Its counters, load_seconds, and cpu_adapters, cpu_bytes, held_weights now."""
        return {
            **self._counters,
            "load_seconds": self._load_seconds,
            "cpu_adapters": len(self._weights),
            "cpu_bytes": sum(self._bytes.values()),
            "held_weights": len(self._holds),
        }

    def loads(self) -> dict[str, tuple[int, float]]:
        """Each weights sha256 ever read in: (disk loads, their seconds)."""
        return {sha: (row[0], row[1]) for sha, row in self._loads_of.items()}
