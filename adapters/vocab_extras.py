"""The vocabulary side of an adapter: LoRA on ``embed_tokens`` (``lora_embedding_A/B``) and on
``lm_head``, whole copies of either (``modules_to_save``), and retrained embedding rows
(PEFT's trainable tokens). Read from the adapter's tensors beside its per-layer LoRA.

Each is applied to its own rows of a batch only (engine/models/decoder.py): an embedding
LoRA adds ``scale * B[:, A[:, token]]`` to each token's embedding, an lm_head LoRA adds
``scale * B A h`` to its logits, a saved embedding or output matrix replaces the base's for
those rows, and trainable tokens replace only the listed rows of the embedding (and of the
output matrix where the model ties the two). PEFT also writes the base's own embedding and
output matrices (``base_layer``) beside an adapter on them: those are the base model's, not
the adapter's, and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from loragate.adapters.errors import AdapterShapeError, UnsupportedAdapterError
from loragate.adapters.peft_config import LoraConfigFields
from loragate.adapters.spec import LoRAModelSpec

EMBED, HEAD = "embed_tokens", "lm_head"


@dataclass(frozen=True, eq=False)
class VocabExtras:
    """What one adapter does on the vocabulary side (None: nothing of that kind)."""

    embed_lora: tuple[torch.Tensor, torch.Tensor, float] | None = None  # A^T [V, r], B [H, r]
    head_lora: tuple[torch.Tensor, torch.Tensor, float] | None = None  # A [r, H], B [V, r]
    embed_table: torch.Tensor | None = None  # [V, H]
    head_table: torch.Tensor | None = None  # [V, H]
    token_ids: torch.Tensor | None = None  # [n] int64
    token_rows: torch.Tensor | None = None  # [n, H]
    tied: bool = False  # trainable tokens replace the output matrix's rows too

    @property
    def tensors(self) -> list[torch.Tensor]:
        held = [self.embed_table, self.head_table, self.token_ids, self.token_rows]
        for lora in (self.embed_lora, self.head_lora):
            if lora is not None:
                held += lora[:2]
        return [t for t in held if t is not None]

    @property
    def num_params(self) -> int:
        return sum(t.numel() for t in self.tensors)

    def without_head_lora(self) -> VocabExtras | None:
        """The rest of it, which the slots keep per adapter (the lm_head LoRA goes into the
        slots' head stacks); None when nothing is left."""
        rest = replace(self, head_lora=None)
        return rest if rest.tensors else None

    def to(self, device, dtype) -> VocabExtras:
        """A copy on ``device``: matrices in ``dtype``, LoRA factors in float32."""

        def moved(t, as_dtype=dtype):
            return None if t is None else t.to(device=device, dtype=as_dtype)

        def lora(pair):
            if pair is None:
                return None
            return (moved(pair[0], torch.float32), moved(pair[1], torch.float32), pair[2])

        return VocabExtras(
            embed_lora=lora(self.embed_lora),
            head_lora=lora(self.head_lora),
            embed_table=moved(self.embed_table),
            head_table=moved(self.head_table),
            token_ids=moved(self.token_ids, torch.int64),
            token_rows=moved(self.token_rows),
            tied=self.tied,
        )


def is_vocab_key(key: str) -> bool:
    parts = key.split(".")
    return EMBED in parts or HEAD in parts


def read_vocab_extras(
    tensors: dict[str, torch.Tensor], config: LoraConfigFields, spec: LoRAModelSpec, path: Path
) -> VocabExtras | None:
    """The vocabulary-side parts among ``tensors`` (the keys ``is_vocab_key`` names), checked
    against the model; None when the adapter has none."""
    if not tensors and not config.modules_to_save and not config.trainable_token_indices:
        return None
    if spec.vocab_size < 1:
        raise UnsupportedAdapterError(
            f"tensor {next(iter(tensors), 'modules_to_save')!r} is for the vocabulary side, "
            "which this model offers no adapter",
            path=path,
            field=next(iter(tensors), "modules_to_save"),
        )
    found: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        found[_part(key, path)] = tensor
    found.pop("embed_base", None)
    found.pop("head_base", None)
    vocab, hidden = spec.vocab_size, spec.hidden_size
    extras = {}
    embed_pair = _pair(found, "embed_A", "embed_B", path)
    if embed_pair is not None:
        a, b = embed_pair  # A [r, V], B [H, r]
        _shape(a, (None, vocab), "lora_embedding_A", path)
        _shape(b, (hidden, a.shape[0]), "lora_embedding_B", path)
        scale = config.scale_for(EMBED)
        extras["embed_lora"] = (a.T.contiguous(), b.contiguous(), scale)
    head_pair = _pair(found, "head_A", "head_B", path)
    if head_pair is not None:
        a, b = head_pair  # A [r, H], B [V, r]
        _shape(a, (None, hidden), "lm_head lora_A", path)
        _shape(b, (vocab, a.shape[0]), "lm_head lora_B", path)
        extras["head_lora"] = (a.contiguous(), b.contiguous(), config.scale_for(HEAD))
    for module, name in ((EMBED, "embed_table"), (HEAD, "head_table")):
        table = found.pop(f"{module}_saved", None)
        if module in config.modules_to_save:
            if table is None:
                raise AdapterShapeError(
                    f"field 'modules_to_save' lists {module} but the weights hold no copy of it",
                    path=path,
                    field="modules_to_save",
                )
            _shape(table, (vocab, hidden), f"the saved {module}", path)
            extras[name] = table.contiguous()
        elif table is not None:
            raise AdapterShapeError(
                f"the weights hold a whole {module}, which 'modules_to_save' does not list",
                path=path,
                field="modules_to_save",
            )
    rows = found.pop("tokens", None)
    indices = config.trainable_token_indices
    if indices or rows is not None:
        if rows is None or not indices:
            raise AdapterShapeError(
                "trainable_token_indices and the trainable_tokens_delta tensor come together",
                path=path,
                field="trainable_token_indices",
            )
        _shape(rows, (len(indices), hidden), "trainable_tokens_delta", path)
        if max(indices) >= vocab:
            raise AdapterShapeError(
                f"field 'trainable_token_indices' names token {max(indices)}, past the base "
                f"model's vocabulary of {vocab}",
                path=path,
                field="trainable_token_indices",
            )
        extras["token_ids"] = torch.tensor(indices, dtype=torch.int64)
        extras["token_rows"] = rows.contiguous()
        extras["tied"] = spec.tied_embeddings
    if found:
        raise UnsupportedAdapterError(
            f"tensor for {sorted(found)[0]} is not an adapter part loragate can serve",
            path=path,
            field=sorted(found)[0],
        )
    if not extras:
        return None
    for name in ("embed_table", "head_table", "token_rows"):
        if name in extras:
            extras[name] = extras[name].to(torch.float32)
    for name in ("embed_lora", "head_lora"):
        if name in extras:
            a, b, scale = extras[name]
            extras[name] = (a.to(torch.float32), b.to(torch.float32), scale)
    return VocabExtras(**extras)


def _part(key: str, path: Path) -> str:
    """Which vocabulary-side tensor ``key`` is (PEFT's names, with or without an adapter
    name in them)."""
    parts = key.split(".")
    module = EMBED if EMBED in parts else HEAD
    tail = parts[parts.index(module) + 1 :]
    if tail and tail[0] == "base_layer":
        return "embed_base" if module == EMBED else "head_base"
    if module == EMBED and tail and tail[0] in ("lora_embedding_A", "lora_embedding_B"):
        return "embed_" + tail[0][-1]
    if module == HEAD and tail and tail[0] in ("lora_A", "lora_B") and tail[-1] == "weight":
        return "head_" + tail[0][-1]
    if module == EMBED and "trainable_tokens_delta" in tail:
        return "tokens"
    if tail in (["weight"], ["modules_to_save", "weight"]) or (
        len(tail) == 3 and tail[0] == "modules_to_save" and tail[-1] == "weight"
    ):
        return f"{module}_saved"
    raise UnsupportedAdapterError(
        f"tensor {key!r} is not an adapter part loragate can serve", path=path, field=key
    )


def _pair(found: dict, a_name: str, b_name: str, path: Path):
    a, b = found.pop(a_name, None), found.pop(b_name, None)
    if (a is None) != (b is None):
        lone = a_name if a is not None else b_name
        raise AdapterShapeError(f"{lone} comes without its other half", path=path, field=lone)
    return None if a is None else (a, b)


def _shape(tensor: torch.Tensor, shape: tuple, what: str, path: Path) -> None:
    ok = (
        tensor.is_floating_point()
        and tensor.dim() == len(shape)
        and all(
            want is None or have == want for have, want in zip(tensor.shape, shape, strict=True)
        )
    )
    if not ok:
        wanted = tuple("r" if s is None else s for s in shape)
        raise AdapterShapeError(
            f"{what} has shape {tuple(tensor.shape)} ({tensor.dtype}), but the base model "
            f"takes {wanted}",
            path=path,
            field=what,
        )
