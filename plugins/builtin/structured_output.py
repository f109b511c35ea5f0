"""Structured output as a logits processor: llguidance masks every token that cannot
continue a match of the request's JSON schema, regex, choice list or Lark grammar.

Plain data in, as every hook: the request's ``structured_outputs`` dict. A processor keeps
one grammar matcher per generated prefix, so it serves n > 1 samples and beam search, whose
sequences share one processor and diverge. Grammars are compiled once per distinct spec
(an LRU of matchers, copied per request); the tokenizer's token table once per tokenizer.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict

import llguidance
import torch

from loragate import kernels
from loragate.plugins.errors import InvalidParam
from loragate.plugins.markers import hookimpl

CACHED_GRAMMARS = 128


class StructuredOutput:
    def __init__(self):
        self._tokenizers: dict[int, tuple[object, llguidance.LLTokenizer]] = {}
        self._matchers: OrderedDict[tuple[int, str], llguidance.LLMatcher] = OrderedDict()

    @hookimpl(trylast=True)
    def loragate_logits_processors(self, params, model):
        spec = params.get("structured_outputs")
        if not spec:
            return None
        tokenizer = self._tokenizer(model)
        matcher = self._compiled(tokenizer, grammar_of(spec))
        return [GrammarProcessor(matcher.deep_copy(), tokenizer.vocab_size)]

    def _tokenizer(self, model: dict) -> llguidance.LLTokenizer:
        hf = model["tokenizer"]
        known = self._tokenizers.get(id(hf))
        if known is None or known[0] is not hf:
            built = token_table(hf, model["vocab_size"], model["eos_token_ids"])
            known = self._tokenizers[id(hf)] = (hf, built)
        return known[1]

    def _compiled(self, tokenizer, grammar: str) -> llguidance.LLMatcher:
        key = (id(tokenizer), grammar)
        matcher = self._matchers.get(key)
        if matcher is not None:
            self._matchers.move_to_end(key)
            return matcher
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise InvalidParam(
                "structured_outputs",
                f"structured_outputs cannot be compiled: {'; '.join(messages)}",
            )
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise InvalidParam(
                "structured_outputs",
                f"structured_outputs cannot be compiled: {matcher.get_error()}",
            )
        self._matchers[key] = matcher
        if len(self._matchers) > CACHED_GRAMMARS:
            self._matchers.popitem(last=False)
        return matcher


def token_table(hf, vocab_size: int, eos_token_ids) -> llguidance.LLTokenizer:
    """llguidance's view of a fast HF tokenizer: every token's bytes (about a second)."""
    return llguidance.LLTokenizer(
        _tokenizer_json(hf), n_vocab=vocab_size, eos_token=sorted(eos_token_ids)
    )


def _tokenizer_json(hf) -> str:
    """The fast tokenizer as JSON, with the decoder llguidance reads token bytes from.

    transformers' GGUF conversion (the default model's) gives a byte-level BPE a decoder
    chain that starts with ByteFallback; llguidance then takes tokens such as 'Ġ"' for
    their literal characters instead of ' "'. A byte-level pre-tokenizer means byte-level
    tokens, so the decoder is set to say so.
    """
    tokenizer = copy.copy(hf.backend_tokenizer)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    data = json.loads(tokenizer.to_str())
    if _has_byte_level(data.get("pre_tokenizer")) and _has_byte_level(data.get("decoder")):
        data["decoder"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }
    return json.dumps(data)


def _has_byte_level(part) -> bool:
    if not isinstance(part, dict):
        return False
    if part.get("type") == "ByteLevel":
        return True
    children = part.get("pretokenizers") or part.get("decoders") or []
    return any(_has_byte_level(child) for child in children)


# JSON without free whitespace between tokens: a model (or an adapter) that likes
# whitespace can otherwise fill max_tokens with it and never close the object. A schema's
# own "x-guidance" options (llguidance's) override this default.
JSON_DEFAULTS = {"whitespace_flexible": False}


def grammar_of(spec: dict) -> str:
    """llguidance's grammar text for one StructuredOutputsParams (as a dict)."""
    if spec.get("json") is not None:
        return llguidance.LLMatcher.grammar_from_json_schema(spec["json"], JSON_DEFAULTS)
    if spec.get("json_object"):
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_DEFAULTS)
    if spec.get("regex") is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec["regex"])
    if spec.get("choice") is not None:
        alternatives = " | ".join(json.dumps(choice) for choice in spec["choice"])
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if spec.get("grammar") is not None:
        return llguidance.LLMatcher.grammar_from_lark(spec["grammar"])
    raise InvalidParam("structured_outputs", f"structured_outputs names nothing to match: {spec!r}")


class GrammarProcessor:
    """``(output_token_ids, logits) -> logits`` with every forbidden token at -inf.

    Matchers are kept by the prefix they consumed: the usual call advances the previous
    step's matcher by one token; a sequence whose prefix is not kept (a fork, a beam) is
    replayed from the start on a copy.
    """

    def __init__(self, start: llguidance.LLMatcher, vocab_size: int):
        self._start = start
        self._by_prefix: dict[tuple[int, ...], llguidance.LLMatcher] = {(): start.deep_copy()}
        self._vocab_size = vocab_size
        self._mask = torch.full((1, (vocab_size + 31) // 32), -1, dtype=torch.int32)  # per step

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.fill_bitmask(output_token_ids, self._mask, 0)
        # The engine hands processors a row of its own copy of the step's logits: masking it
        # in place spares a vocabulary-sized allocation per request and step.
        return kernels.apply_token_mask_(logits, self._mask[0])

    def fill_bitmask(self, output_token_ids: list[int], bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed after `output_token_ids` into row `row` of an int32
        bitmask: the engine fills one for all its constrained rows and applies it in one
        call (engine/sampling/grammar_masks.py)."""
        matcher = self._matcher_for(tuple(output_token_ids))
        # llguidance.torch's fill_next_token_bitmask does this; importing that module costs
        # every process 1.7 s (a torch.compile decorator pulls in torch._dynamo).
        words = bitmask[row]
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or not words.is_contiguous():
            raise ValueError("a token bitmask is a contiguous int32 CPU tensor")
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)

    def _matcher_for(self, prefix: tuple[int, ...]) -> llguidance.LLMatcher:
        matcher = self._by_prefix.get(prefix)
        if matcher is not None:
            return matcher
        parent = self._by_prefix.pop(prefix[:-1], None) if prefix else None
        if parent is None:
            matcher = self._start.deep_copy()
            consumed = matcher.consume_tokens(list(prefix))
        else:
            matcher = parent
            consumed = matcher.consume_token(prefix[-1])
        if not consumed or matcher.is_error():
            raise ValueError(
                f"the output left the grammar at token {prefix[-1] if prefix else None}: "
                f"{matcher.get_error()}"
            )
        self._by_prefix[prefix] = matcher
        return matcher
