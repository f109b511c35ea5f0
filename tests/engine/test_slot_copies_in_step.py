"""The engine with its slots' copies pipelined as on a GPU (adapters/slot_copies.py), run on
the CPU through recorded stream operations (tests/recorded_streams.py): the step that admits
an adapter copies its rows a layer at a time on the side stream, the forward waits for each
layer's copy before it reads that layer's LoRA, and every answer is PEFT's, float32, token
for token, in one mixed batch of the base, an adapter whose copied module's layers differ in
rank, and one whose modules the slots borrow."""

from __future__ import annotations

import torch
from recorded_streams import RecordedStreams
from tiny_llama import ALL_MODULES, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.adapters.slot_copies import SlotCopies
from loragate.engine import SamplingParams
from loragate.engine.models import decoder as decoder_module
from loragate.tools import make_random_adapter

N = 10


def test_the_forward_reads_each_layer_after_its_copy_and_answers_as_peft(
    tiny_model_dir, tmp_path, make_llm, monkeypatch
):
    model_dir = tiny_model_dir("llama")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    uneven = {"layers.1.mlp.up_proj": 4, "layers.0.self_attn.k_proj": 2}
    paths = {
        "uneven": make_random_adapter(
            base,
            tmp_path / "uneven",
            rank=8,
            targets=ALL_MODULES,
            seed=1,
            init_scale=0.3,
            rank_pattern=uneven,
        ),
        "plain": make_random_adapter(
            base,
            tmp_path / "plain",
            rank=4,
            targets=["q_proj", "v_proj"],
            seed=2,
            init_scale=0.3,
        ),
    }
    peft = peft_model_with(model_dir, paths)
    prompts = [[1, *range(300 + 40 * i, 320 + 40 * i)] for i in range(4)]
    names = [None, "uneven", "plain", "uneven"]
    expected = [peft_greedy(peft, name, p, N) for name, p in zip(names, prompts, strict=True)]
    assert expected[1] != peft_greedy(peft, None, prompts[1], N), "the adapter changes tokens"

    llm = make_llm(
        model=str(model_dir),
        dtype="float32",
        max_model_len=256,
        num_kv_blocks=64,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    slots = llm.llm_engine.residency.slot_tensors
    streams = RecordedStreams()
    slots.copies = SlotCopies(slots.spec.num_layers, streams)
    add_lora = decoder_module._add_lora

    def logged(lora, layer, *args, **kwargs):
        streams.log.append(("read", layer))
        return add_lora(lora, layer, *args, **kwargs)

    monkeypatch.setattr(decoder_module, "_add_lora", logged)
    loras = {
        name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(paths.items())
    }
    params = SamplingParams(temperature=0, max_tokens=N, min_tokens=N)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        params,
        lora_request=[loras.get(name) for name in names],
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in outputs] == expected

    layers = slots.spec.num_layers
    pending: dict[int, int] = {}  # layer -> the event its last copy marked, not waited for
    marked, reads_after_a_copy = 0, 0
    for entry in streams.log:
        if entry[0] == "mark":
            pending[marked % layers] = entry[1]  # a write marks its layers in order
            marked += 1
        elif entry[0] == "wait":
            waited = [layer for layer, event in pending.items() if event == entry[1]]
            assert waited, f"waited for {entry[1]}, which no layer's last copy marked"
            del pending[waited[0]]
        elif entry[0] == "read":
            assert entry[1] not in pending, f"layer {entry[1]} read before its copy was done"
            reads_after_a_copy += marked > 0
    assert marked == 2 * layers, "each adapter's step copied every layer once"
    assert not pending and reads_after_a_copy > 0
