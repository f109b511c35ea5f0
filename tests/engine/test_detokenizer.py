"""Incremental detokenization: streamed deltas add up to the exact decoded text."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from loragate.engine.loading.model_loader import load_tokenizer, resolve_model
from loragate.engine.outputs.detokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"

TEXTS = [
    "Hello 👋 world! 🎉🎉 Let's party 🥳.",
    "日本語のテキストと中文字符，还有한국어도 있습니다。",
    "Café, naïve façade, jalapeño, smörgåsbord, Ærøskøbing — “quotes” ‘too’ … ß",
    "def add(x, y):\n    return x  +  y\n\n\nclass A:\n\tpass  # tab   and spaces\n",
    "Spaces before punctuation stay exact : like this . and this ? ok !",
    "  leading spaces, trailing spaces   ",
    "mixed: αβγ δ ∑∫√ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👨‍👩‍👧‍👦 family emoji",
]


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's tokenizer as the engine loads it, from the converted folder
    (transformers converting the GGUF's vocabulary again takes seconds to a minute)."""
    return load_tokenizer(resolve_model(None).hf_dir)


def stream(detok, token_ids, chunk=1):
    deltas = []
    for start in range(0, len(token_ids), chunk):
        deltas.append(detok.step(token_ids[start : start + chunk]))
    return deltas


def exact_decode(tokenizer, ids, skip_special_tokens=True):
    return tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_decoded_text(tokenizer, text):
    prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = stream(detok, ids)
    full = exact_decode(tokenizer, ids)
    assert full == text
    assert "".join(deltas) == full == detok.text
    assert not any(REPLACEMENT in delta for delta in deltas)


def test_split_characters_are_held_back_until_complete(tokenizer):
    ids = tokenizer.encode("a👋b", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any(REPLACEMENT in piece for piece in pieces), "the emoji should span tokens"
    deltas = stream(IncrementalDetokenizer(tokenizer, []), ids)
    assert [d for d in deltas if d] == ["a", "👋", "b"]
    assert deltas.count("") == len(ids) - 3


@pytest.mark.parametrize("chunk", [2, 3, 7])
def test_several_tokens_per_step(tokenizer, chunk):
    text = TEXTS[0] + TEXTS[1] + TEXTS[3]
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [1])
    assert "".join(stream(detok, ids, chunk)) == text


def test_random_unicode_strings(tokenizer):
    rng = random.Random(0)
    alphabet = (
        list("abcxyz ABC 0129 \n\t.,!?")
        + list("éüñçøåß")
        + list("日本語中文한국")
        + [
            "👋",
            "🎉",
            "🥳",
            "𝔘",
            "∑",
        ]
    )
    for _ in range(30):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Hi", add_special_tokens=False))
        deltas = stream(detok, ids)
        assert "".join(deltas) == exact_decode(tokenizer, ids) == text
        assert not any(REPLACEMENT in delta for delta in deltas)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tokenizer, skip):
    body = tokenizer.encode("Sure, here it is.", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = body + [im_end] + body
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
    text = "".join(stream(detok, ids))
    assert text == exact_decode(tokenizer, ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in text) is not skip


def test_held_back_invalid_tail_is_flushed(tokenizer):
    ids = tokenizer.encode("ok👋", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    text = "".join(stream(detok, ids[:-1]))
    assert text == "ok"
    tail = detok.flush()
    assert tail.endswith(REPLACEMENT)
    assert detok.text == exact_decode(tokenizer, ids[:-1])


class CountingTokenizer:
    """Records how many ids each decode call sees."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sizes = []

    def decode(self, ids, **kwargs):
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_each_step_decodes_a_bounded_window(tokenizer):
    text = " ".join(TEXTS) * 8
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 500
    counting = CountingTokenizer(tokenizer)
    prompt = list(range(100, 1100))
    detok = IncrementalDetokenizer(counting, prompt)
    assert "".join(stream(detok, ids)) == text
    assert max(counting.sizes) <= 12
    assert len(counting.sizes) <= 2 * len(ids) + 1


# -- a tiny SentencePiece-style tokenizer: byte fallback and a leading-space strip ---------


@pytest.fixture(scope="module")
def sentencepiece_like():
    words = ["<unk>", "<s>", "▁Hello", "▁world", "!", "▁foo", "bar"]
    vocab = {w: i for i, w in enumerate(words)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
    return tok, vocab


def test_leading_space_comes_from_the_prompt_context(sentencepiece_like):
    tok, vocab = sentencepiece_like
    prompt = [vocab["<s>"], vocab["▁Hello"]]
    out = [vocab["▁world"], vocab["!"], vocab["▁foo"], vocab["bar"]]
    assert tok.decode(out) == "world! foobar"  # decoding alone loses the space
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = stream(detok, out)
    assert deltas == [" world", "!", " foo", "bar"]


def test_byte_fallback_character_split_over_tokens(sentencepiece_like):
    tok, vocab = sentencepiece_like
    hi = [vocab[f"<0x{b:02X}>"] for b in "日".encode()]
    out = [vocab["▁world"], *hi, vocab["▁foo"]]
    detok = IncrementalDetokenizer(tok, [vocab["▁Hello"]])
    deltas = stream(detok, out)
    assert deltas == [" world", "", "", "日", " foo"]
