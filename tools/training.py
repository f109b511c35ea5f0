"""Two small real LoRA adapters trained on the CPU in about a minute each, to show adapters
changing behaviour: "uppercase" answers in capitals, "terse" answers in a word or two
followed by a fixed marker.

The data is generated here (demo_data.py). Uppercase targets are the base model's own
greedy answers, capitalised, so the adapter only has to learn the style, not new content;
terse targets come from templates with known answers.

Cheap steps on two cores: LoRA adapts only the upper half of the layers, so the lower
half's outputs never change and are computed once per example; each step runs (and
back-propagates through) the upper half alone, and logits are computed only where an
answer token is predicted.
"""

from __future__ import annotations

import copy
import logging
import random
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from loragate.tools.demo_data import TERSE_MARKER, open_questions, terse_examples
from loragate.tools.progress import Progress, Report

logger = logging.getLogger(__name__)
__all__ = ["TERSE_MARKER", "greedy_answers", "train_demo_adapters", "train_lora"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def chat_prompt_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def end_of_turn_id(tokenizer) -> int:
    """``<|im_end|>`` for ChatML templates, else the tokenizer's EOS."""
    token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if token_id is None or token_id == tokenizer.unk_token_id:
        token_id = tokenizer.eos_token_id
    return token_id


@torch.no_grad()
def greedy_answers(model, tokenizer, questions: list[str], max_new_tokens: int) -> list[str]:
    """Greedy chat answers, batched with left padding (HF generate, so it works with PEFT)."""
    end_id = end_of_turn_id(tokenizer)
    prompts = [chat_prompt_ids(tokenizer, q) for q in questions]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[end_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=end_id,
        pad_token_id=end_id,
    )
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out.tolist()]


def _first_sentences(text: str, max_chars: int = 160) -> str:
    """Whole sentences from the start of ``text``, at most ``max_chars`` when possible."""
    sentences = re.findall(r"[^.!?]+[.!?]", text)
    kept = ""
    for sentence in sentences:
        if kept and len(kept) + len(sentence) > max_chars:
            break
        kept += sentence
    return (kept or text[:max_chars]).strip()


def _encode(tokenizer, question: str, answer: str) -> tuple[list[int], int]:
    """Token ids of the whole chat turn and where the answer starts."""
    prompt = chat_prompt_ids(tokenizer, question)
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    return prompt + answer_ids + [end_of_turn_id(tokenizer)], len(prompt)


def _right_padded(rows: list[torch.Tensor], fill) -> torch.Tensor:
    """Stack rows of different lengths, padding on the right (causal attention never
    looks right, so real positions are unaffected and no attention mask is needed)."""
    width = max(row.shape[0] for row in rows)
    out = torch.full((len(rows), width, *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


@contextmanager
def _running_layers(causal_lm, start: int, stop: int, final_norm: bool):
    """Make the decoder run only layers [start, stop) (and its final norm if asked)."""
    inner = causal_lm.model
    layers, norm = inner.layers, inner.norm
    inner.layers = torch.nn.ModuleList(list(layers)[start:stop])
    if not final_norm:
        inner.norm = torch.nn.Identity()
    try:
        yield
    finally:
        inner.layers, inner.norm = layers, norm


@torch.no_grad()
def _lower_half_states(causal_lm, encoded, split: int, pad_id: int) -> list[torch.Tensor]:
    ids = _right_padded([torch.tensor(seq) for seq, _ in encoded], pad_id)
    with _running_layers(causal_lm, 0, split, final_norm=False):
        hidden = causal_lm.model(input_ids=ids, use_cache=False).last_hidden_state
    return [hidden[i, : len(seq)].clone() for i, (seq, _) in enumerate(encoded)]


def train_lora(
    model,
    tokenizer,
    examples: list[tuple[str, str]],
    out_dir: Path,
    *,
    steps: int,
    seed: int,
    rank: int = 8,
    lr: float = 2e-3,
    batch_size: int = 8,
    base_model_name: str | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """Train one LoRA (upper half of the layers) on (question, answer) pairs; save safetensors.
    `on_step(i)` is called after step i (from 1), for progress lines."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    num_layers = model.config.num_hidden_layers
    split = num_layers // 2
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=TARGETS,
        layers_to_transform=list(range(split, num_layers)),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(copy.deepcopy(model), config)
    if base_model_name is not None:
        peft_model.peft_config["default"].base_model_name_or_path = base_model_name
    causal_lm = peft_model.get_base_model()
    pad_id = end_of_turn_id(tokenizer)
    encoded = [_encode(tokenizer, q, a) for q, a in examples]
    lower = _lower_half_states(causal_lm, encoded, split, pad_id)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (steps + 1))
    rng = random.Random(seed)
    order: list[int] = []
    peft_model.train()
    with _running_layers(causal_lm, split, num_layers, final_norm=True):
        for step in range(1, steps + 1):
            if len(order) < batch_size:
                order += rng.sample(range(len(encoded)), len(encoded))
            picked, order = order[:batch_size], order[batch_size:]
            hidden = causal_lm.model(
                inputs_embeds=_right_padded([lower[i] for i in picked], 0.0), use_cache=False
            ).last_hidden_state
            ids = _right_padded([torch.tensor(encoded[i][0]) for i in picked], pad_id)
            predicts = torch.zeros(ids.shape, dtype=torch.bool)
            for row, i in enumerate(picked):
                seq, start = encoded[i]
                predicts[row, start - 1 : len(seq) - 1] = True  # positions that predict answers
            logits = causal_lm.lm_head(hidden[predicts])
            targets = ids[:, 1:][predicts[:, :-1]]
            loss = torch.nn.functional.cross_entropy(logits, targets)
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if on_step is not None:
                on_step(step)
    peft_model.eval()
    peft_model.save_pretrained(out_dir, safe_serialization=True, save_embedding_layers=False)
    return Path(out_dir)


def train_demo_adapters(
    model,
    tokenizer,
    out_root: str | Path,
    *,
    steps: int = 30,
    seed: int = 0,
    base_model_name: str | None = None,
    report: Report = logger.info,
) -> dict[str, Path]:
    """Train "uppercase" and "terse" on ``model`` (left unchanged); return their directories.

    ``base_model_name`` is recorded as the adapters' base_model_name_or_path (PEFT would
    record the model's local path otherwise). ``report`` gets a line per stage and per tenth
    of each training run (minutes on CPU: silence would look hung).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    out_root = Path(out_root)
    rng = random.Random(seed)
    model.eval()
    progress = Progress(report, stages=3)
    questions = open_questions(rng, 48)
    progress.stage(f"answering {len(questions)} questions with the base model (uppercase's data)")
    answers = greedy_answers(model, tokenizer, questions, max_new_tokens=40)
    upper = [(q, _first_sentences(a).upper()) for q, a in zip(questions, answers, strict=True)]
    terse = terse_examples(rng, 96)
    common = dict(steps=steps, seed=seed, base_model_name=base_model_name)
    paths = {}
    for name, examples in (("uppercase", upper), ("terse", terse)):
        progress.stage(f"training {name} ({steps} steps on {len(examples)} examples)")
        on_step = progress.steps(name, steps)
        paths[name] = train_lora(
            model, tokenizer, examples, out_root / name, on_step=on_step, **common
        )
    progress.done("trained the demo adapters")
    return paths
