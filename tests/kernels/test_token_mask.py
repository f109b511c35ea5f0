"""A grammar's bitmask on a row of logits (kernels/token_mask.py): bit i of int32 word w is
token 32w+i, sign bits included; a clear bit and every token past the words give -inf, the
rest keep their value; native and torch paths alike, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from loragate import kernels
from loragate.kernels.token_mask import _library, allowed_tokens


def _reference(words: torch.Tensor, vocab: int) -> list[bool]:
    bits = []
    for word in words.tolist():
        bits += [bool((word >> i) & 1) for i in range(32)]
    return (bits + [False] * vocab)[:vocab]


def _words(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int64)
    words = words.to(torch.int32)
    words[0], words[1], words[2] = -1, 0, -(2**31)  # all set, none, only the sign bit
    return words


VOCABS = (1, 31, 32, 33, 1280, 40 * 32, 40 * 32 + 17)


def test_native_kernel_is_built():
    assert _library.get() is not None, _library.error()


@pytest.mark.parametrize("vocab", VOCABS)
def test_allowed_tokens_match_bit_by_bit(vocab):
    words = _words(40, vocab)
    got = allowed_tokens(words, vocab)
    assert got.dtype == torch.bool and got.shape == (vocab,)
    assert got.tolist() == _reference(words, vocab)


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", VOCABS)
def test_masked_tokens_become_minus_inf_and_others_keep_their_value(backend, dtype, vocab):
    words = _words(40, vocab + 1)
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
    before = logits.clone()
    out = kernels.apply_token_mask_(logits, words, backend=backend)
    assert out is logits, "in place"
    allowed = torch.tensor(_reference(words, vocab))
    assert torch.equal(logits[allowed], before[allowed])
    assert bool((logits[~allowed] == float("-inf")).all())


def test_a_strided_row_takes_the_torch_path():
    words = _words(4, 0)
    batch = torch.randn(128, 3)
    row = batch[:, 1]  # not contiguous
    expected = row.clone().masked_fill_(~allowed_tokens(words, 128), float("-inf"))
    kernels.apply_token_mask_(row, words)
    assert torch.equal(batch[:, 1], expected)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="int32"):
        kernels.apply_token_mask_(torch.zeros(4), torch.zeros(1, dtype=torch.int64))
