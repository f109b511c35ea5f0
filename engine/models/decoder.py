"""The paged decoder every family runs on: one flat batch of tokens per forward pass over the
paged KV cache, the family's differences read from its Architecture (architecture.py).

q/k/v and gate/up run as fused matmuls, and so do their LoRA deltas: one batched shrink and
one expand per fused projection add every module's delta into its columns of the fused
output (Phi-3's checkpoint is fused already, and its adapters target the fused modules).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from loragate import kernels
from loragate.adapters.spec import LoRAModelSpec
from loragate.engine.loading.cpu_features import bf16_support
from loragate.engine.models.checkpoint import CheckpointWeights
from loragate.engine.models.llama import LlamaFamily
from loragate.engine.runner.forward_batch import ForwardBatch, LoRABatch
from loragate.engine.runner.kv_cache import KVCache

log = logging.getLogger(__name__)

LINEAR_WEIGHTS = ("qkv", "o", "gate_up", "down")


class PagedDecoder:
    """Weights as plain tensors; the forward pass is a function of the batch and the cache."""

    def __init__(
        self,
        config: PretrainedConfig,
        family: LlamaFamily,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.config = config
        self.family = family
        self.arch = family.architecture(config)
        self.device = device
        self.dtype = dtype
        self.num_layers = self.arch.num_layers
        self.num_heads = self.arch.num_heads
        self.num_kv_heads = self.arch.num_kv_heads
        self.head_dim = self.arch.head_dim
        self.vocab_size = self.arch.vocab_size
        self.layers: list[dict[str, torch.Tensor]] = []
        self.embed_tokens: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.lm_head: torch.Tensor | None = None
        self.rope: list[torch.Tensor] = []
        self.embed_scale: torch.Tensor | None = None
        self.checkpoint: CheckpointWeights | None = None
        self.activation_quantization: str | None = None  # set by load_weights

    # ---- what the adapter layer needs ---------------------------------------------------
    def lora_spec(self, model_name: str) -> LoRAModelSpec:
        """This model's LoRA-targetable modules, their shapes and its fused groups, and where
        an adapter loader reads a base weight (DoRA's norms) when the checkpoint is known."""
        spec = self.family.lora_spec(self.config, model_name)
        if self.checkpoint is None:
            return spec
        return replace(spec, base_weight=self.checkpoint.weight)

    def describe(self) -> str:
        return self.arch.describe()

    # ---- loading ------------------------------------------------------------------------
    def load_weights(
        self,
        weights: dict[str, torch.Tensor],
        max_positions: int,
        checkpoint: Path | None = None,
        quantization: str | None = None,
        activation_quantization: str | None = None,
    ) -> None:
        """``checkpoint``: the HF directory the weights came from, read again for a base
        weight in float32 when an adapter needs one (DoRA); ``quantization``: the
        ``--quantization`` the weights were loaded with (the base weight an adapter sees is
        then the dequantized one); ``activation_quantization``: the block-format weights'
        optional fast mode ("int8", kernels/quant_int8.py)."""
        self.activation_quantization = activation_quantization
        arch, family = self.arch, self.family
        if checkpoint is not None:
            self.checkpoint = CheckpointWeights(checkpoint, family, quantization)
        renamed = family.checkpoint_names(set(weights))
        if renamed:
            weights = {renamed.get(name, name): tensor for name, tensor in weights.items()}

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"weights are missing tensor {name!r}")
            return weights[name]

        def optional(name: str) -> torch.Tensor | None:
            return weights.get(name)

        self.embed_tokens = self._placed(take("model.embed_tokens.weight"))
        self.norm = self._placed(family.norm_weight(take("model.norm.weight")))
        tied = getattr(self.config, "tie_word_embeddings", False)
        lm_head = self.embed_tokens if tied or "lm_head.weight" not in weights else None
        if lm_head is None:
            lm_head = self._placed(take("lm_head.weight"))
        _expect_shape("model.embed_tokens.weight", self.embed_tokens, (arch.vocab_size, None))
        native_bf16 = self.dtype == torch.bfloat16 and bf16_support().native
        self.layers = []
        for i in range(arch.num_layers):
            prefix = f"model.layers.{i}."
            layer = {
                name: None if tensor is None else self._placed(tensor)
                for name, tensor in family.layer_weights(take, optional, prefix).items()
            }
            _expect_shape(prefix + "qkv", layer["qkv"], (arch.q_size + 2 * arch.kv_size, None))
            _expect_shape(prefix + "gate_up", layer["gate_up"], (2 * arch.intermediate_size, None))
            for name in LINEAR_WEIGHTS:
                layer[name] = kernels.pack_weight(layer[name], native_bf16)
            self.layers.append(layer)
        # the embedding keeps its own copy
        self.lm_head = kernels.pack_weight(lm_head, native_bf16)
        tables = family.rope_tables(self.config, max_positions, "cpu")
        self.rope = [table.to(device=self.device, dtype=self.dtype) for table in tables]
        if arch.embed_scale is not None:
            # HF scales in the weights' dtype: a float32 scalar cast to it, then multiplied.
            scale = torch.tensor(arch.embed_scale, dtype=torch.float32)
            self.embed_scale = scale.to(device=self.device, dtype=self.dtype)
        held = self.weight_bytes()
        log.info(
            "base weights held: %.1f MB (%s)",
            sum(held.values()) / 1e6,
            ", ".join(f"{kind} {size / 1e6:.1f} MB" for kind, size in sorted(held.items())),
        )

    def _placed(self, tensor):
        """A float tensor in the model's device and dtype; a GGUF block-format weight kept in
        its blocks (only moved)."""
        if isinstance(tensor, kernels.QuantizedWeight):
            order = tensor.input_order  # GPTQ act-order's, beside the blocks
            return replace(
                tensor,
                blocks=tensor.blocks.to(self.device),
                input_order=None if order is None else order.to(self.device),
                activations=self.activation_quantization,
            )
        if isinstance(tensor, kernels.StackedWeights):
            return kernels.StackedWeights(tuple(self._placed(p) for p in tensor.parts))
        return tensor.to(device=self.device, dtype=self.dtype)

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of the base weights the model holds, per tensor type (a GGUF block type or a
        dtype), each tensor counted once (a tied output matrix is the embedding)."""
        held: dict[str, int] = {}
        seen: set[int] = set()

        def count(value) -> None:
            if value is None or id(value) in seen:
                return
            seen.add(id(value))
            if isinstance(value, kernels.StackedWeights):
                for part in value.parts:
                    count(part)
                return
            if isinstance(value, kernels.QuantizedWeight):
                kind, size = value.format, value.nbytes
            elif isinstance(value, kernels.PackedWeight):
                kind = str(value.packed.dtype).removeprefix("torch.")
                size = value.packed.numel() * value.packed.element_size()
            else:
                kind = str(value.dtype).removeprefix("torch.")
                size = value.numel() * value.element_size()
            held[kind] = held.get(kind, 0) + size

        for value in (self.embed_tokens, self.norm, self.lm_head, self.embed_scale):
            count(value)
        for layer in self.layers:
            for value in layer.values():
                count(value)
        return held

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``ids``: rows of a GGUF block-format table dequantized alone."""
        if isinstance(self.embed_tokens, kernels.QuantizedWeight):
            return kernels.dequantized_rows(self.embed_tokens, ids).to(self.dtype)
        return F.embedding(ids, self.embed_tokens)

    # ---- forward ------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Hidden states (after the final norm) of the rows in batch.sample_indices.

        Each layer's closing residual add is fused with the next layer's input norm (and the
        attention's with the MLP's input norm): kernels.add_rms_norm, one pass on the CPU.
        """
        eps = self.arch.eps
        extras = self._extra_rows(batch.lora)
        residual = self._embed(batch.input_ids)
        for rows, vocab in _vocab_rows(batch.lora, None):
            residual[rows] = _embed_rows(residual[rows], batch.input_ids[rows], vocab)
        if self.embed_scale is not None:
            residual = residual * self.embed_scale
        x = kernels.rms_norm(residual, self.layers[0]["input_norm"], eps)
        for i, layer in enumerate(self.layers):
            down, residual = self._layer(i, layer, x, residual, batch, kv, extras)
            if i + 1 < self.num_layers:
                x, residual = kernels.add_rms_norm(
                    down, residual, self.layers[i + 1]["input_norm"], eps
                )
        rows = batch.sample_indices
        return kernels.rms_norm(residual[rows] + down[rows], self.norm, eps)

    @staticmethod
    def _extra_rows(lora: LoRABatch | None):
        """(rows, their slots) of the step's DoRA and lora_B-bias adapters, or None."""
        extra = lora.weights.extra_slots if lora is not None else None
        if not extra:
            return None
        ids = lora.slot_ids
        marked = torch.zeros(lora.weights.max_loras + 1, dtype=torch.bool, device=ids.device)
        marked[list(extra)] = True
        rows = marked[ids].nonzero().squeeze(1)  # base rows (-1) read the last, False
        return (rows, ids[rows]) if rows.numel() else None

    def compute_logits(self, hidden: torch.Tensor, batch: ForwardBatch | None = None):
        """Logits of the sampled rows (``forward``'s output): the base's output matrix,
        and the vocabulary side of the rows' adapters where the batch has any."""
        logits = kernels.linear(hidden, self.lm_head).float()
        lora = batch.lora if batch is not None else None
        for rows, vocab in _vocab_rows(lora, batch.sample_indices if lora else None):
            if vocab.head_table is not None or (vocab.token_ids is not None and vocab.tied):
                logits[rows] = _head_rows(logits[rows], hidden[rows], vocab)
        if lora is not None:
            _add_head_lora(lora, batch.sample_indices, hidden, logits)
        cap = self.arch.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _layer(self, i, layer, x, residual, batch: ForwardBatch, kv: KVCache, extras=None):
        """x = the layer's normed input, residual = the stream it was normed from; returns
        the MLP output and the residual stream after attention (their sum is the output).
        ``extras``: the rows of DoRA and lora_B-bias adapters (``_extra_rows``)."""
        arch = self.arch
        t = x.shape[0]
        if batch.lora is not None:
            batch.lora.weights.ready(i)  # the layer's slot copies, on a GPU, are done
        qkv = kernels.linear(x, layer["qkv"], layer["qkv_bias"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "qkv_proj", x, qkv, extras, layer["qkv_bias"])
        if arch.qk_norm:
            self._norm_heads(qkv, layer, t)
        rotated = arch.num_heads + arch.num_kv_heads  # q and k heads, side by side in qkv
        heads = qkv[:, : rotated * arch.head_dim].view(t, rotated, arch.head_dim)
        if arch.rotary_dim < arch.head_dim:
            heads = heads[:, :, : arch.rotary_dim]
        kernels.apply_rope_(heads, self.rope[arch.layer_rope[i]], batch.positions)
        q, k, v = qkv.split([arch.q_size, arch.kv_size, arch.kv_size], dim=-1)
        q = q.view(t, arch.num_heads, arch.head_dim)
        k = k.view(t, arch.num_kv_heads, arch.head_dim)
        v = v.view(t, arch.num_kv_heads, arch.head_dim)
        k_cache, v_cache = kv.layer(i)
        kernels.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        window = arch.layer_windows[i]
        attn = self._attention(q, k_cache, v_cache, batch, window).reshape(t, arch.q_size)
        o = kernels.linear(attn, layer["o"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "o_proj", attn, o, extras)
        if arch.sandwich_norms:
            o = kernels.rms_norm(o, layer["attn_out_norm"], arch.eps)
        x, residual = kernels.add_rms_norm(o, residual, layer["mlp_norm"], arch.eps)
        gate_up = kernels.linear(x, layer["gate_up"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "gate_up_proj", x, gate_up, extras)
        gate, up = gate_up.chunk(2, dim=-1)
        if arch.activation == "gelu_tanh":
            act = F.gelu(gate, approximate="tanh") * up
        else:
            act = F.silu(gate) * up
        down = kernels.linear(act, layer["down"])
        if batch.lora is not None:
            _add_lora(batch.lora, i, "down_proj", act, down, extras)
        if arch.sandwich_norms:
            down = kernels.rms_norm(down, layer["mlp_out_norm"], arch.eps)
        return down, residual

    def _norm_heads(self, qkv: torch.Tensor, layer, t: int) -> None:
        """Per-head RMSNorm of q and k, in place in the fused output (before RoPE)."""
        arch = self.arch
        d, q_end, k_end = arch.head_dim, arch.q_size, arch.q_size + arch.kv_size
        for name, begin, end in (("q_norm", 0, q_end), ("k_norm", q_end, k_end)):
            heads = qkv[:, begin:end].reshape(-1, d)
            qkv[:, begin:end] = kernels.rms_norm(heads, layer[name], arch.eps).view(t, -1)

    def _attention(self, q, k_cache, v_cache, batch: ForwardBatch, window: int) -> torch.Tensor:
        parts = []
        scale = self.arch.attention_scale
        n_pre = batch.prefill.num_tokens if batch.prefill is not None else 0
        if batch.prefill is not None:
            p = batch.prefill
            parts.append(
                kernels.paged_prefill_attention(
                    q[:n_pre],
                    k_cache,
                    v_cache,
                    p.block_tables,
                    p.seq_lens,
                    p.query_start_loc,
                    scale,
                    window=window,
                )
            )
        if batch.decode is not None:
            d = batch.decode
            parts.append(
                kernels.paged_decode_attention(
                    q[n_pre:], k_cache, v_cache, d.block_tables, d.seq_lens, scale, window=window
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _add_lora(
    lora: LoRABatch,
    layer: int,
    group: str,
    x: torch.Tensor,
    out: torch.Tensor,
    extras=None,
    base_bias: torch.Tensor | None = None,
):
    """Each module of a group (a fused projection or a single one) adds its adapters' output
    to its own columns of the fused output, reading only its own weights: one call for the
    whole group. Then the rows of DoRA adapters are scaled per column (PEFT's
    magnitude / norm(W + scale B A), the base's bias kept out of it) and lora_B biases added."""
    kernels.lora_apply_modules(
        x,
        lora.weights.module_group(layer, group, lora.rank),
        lora.slot_ids,
        lora.weights.scales,
        out,
        backend=lora.backend,
        index=lora.index,
    )
    if extras is None:
        return
    rows, slots = extras
    for columns, scale, bias in lora.weights.row_extras(layer, group):
        part = out[rows, columns]
        if scale is not None:
            if base_bias is None:
                part = part * scale[slots]
            else:
                kept = base_bias[columns]
                part = (part - kept) * scale[slots] + kept
        if bias is not None:
            part = part + bias[slots]
        out[rows, columns] = part.to(out.dtype)


def _vocab_rows(lora: LoRABatch | None, sampled: torch.Tensor | None):
    """(rows, that slot's vocabulary side) per slot in the batch that has one; rows of the
    batch, or of the sampled rows when ``sampled`` is given."""
    vocab = lora.weights.vocab_extras if lora is not None else None
    if not vocab:
        return []
    ids = lora.slot_ids if sampled is None else lora.slot_ids[sampled]
    found = []
    for slot, extras in vocab.items():
        rows = (ids == slot).nonzero().squeeze(1)
        if rows.numel():
            found.append((rows, extras))
    return found


def _embed_rows(base: torch.Tensor, tokens: torch.Tensor, vocab) -> torch.Tensor:
    """One adapter's embeddings of ``tokens``: its own table (modules_to_save) or the
    base's rows, its trainable tokens' rows in place of theirs, plus its embedding LoRA."""
    out = vocab.embed_table[tokens] if vocab.embed_table is not None else base
    if vocab.token_ids is not None:
        match = tokens[:, None] == vocab.token_ids[None, :]
        hit = match.any(1)
        if bool(hit.any()):
            out = torch.where(hit[:, None], vocab.token_rows[match.int().argmax(1)], out)
    if vocab.embed_lora is not None:
        a_t, b, scale = vocab.embed_lora
        out = out + ((a_t[tokens] @ b.T) * scale).to(out.dtype)
    return out


def _head_rows(base: torch.Tensor, hidden: torch.Tensor, vocab) -> torch.Tensor:
    """One adapter's logits for its rows: its own output matrix (modules_to_save) or the
    base's logits with trainable tokens' columns where the model ties them. (Its lm_head
    LoRA is added after, with every other slot's: ``_add_head_lora``.)"""
    if vocab.head_table is not None:
        return (hidden @ vocab.head_table.T).float()
    out = base.clone()
    out[:, vocab.token_ids] = (hidden @ vocab.token_rows.T).float()
    return out


def _add_head_lora(
    lora: LoRABatch,
    sampled: torch.Tensor,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Every sampled row's lm_head LoRA, added to its logits in float32 through the batched
    LoRA kernels, as the projections' are: one shrink and one expand for the step, rows
    grouped by slot; rows whose slot has none (and base rows) untouched. ``backend``: the
    kernels' (None: Triton on CUDA, torch and the native loops on a CPU)."""
    head = lora.weights.head_lora()
    if head is None:
        return
    a, b, scales = head
    ids = lora.slot_ids[sampled]
    has = torch.zeros(a.shape[0] + 1, dtype=torch.bool, device=ids.device)
    has[:-1] = scales != 0  # base rows (-1) read the last, False
    ids = torch.where(has[ids], ids, -1)
    index = kernels.lora_index(ids, a.shape[0])
    kernels.lora_apply(hidden.float(), a, b, ids, scales, logits, backend=backend, index=index)


def _expect_shape(name: str, tensor: torch.Tensor, shape: tuple) -> None:
    ok = len(tensor.shape) == len(shape) and all(
        want is None or have == want for have, want in zip(tensor.shape, shape, strict=True)
    )
    if not ok:
        raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, expected {shape}")
