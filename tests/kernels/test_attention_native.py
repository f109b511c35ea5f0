"""The native CPU paged decode attention (kernels/attention_cpu.c) and its torch reference,
both against float64, in float32 and bfloat16: GQA ratios 1-4, head dims with and without a
vector tail, contexts around block edges and long ones, tables padded with out-of-range ids,
NaN in every cache slot outside a context, strided q (a slice of fused qkv)."""

import math

import pytest
import torch
from kernel_reference import attention_reference, build_paged_cache, context_rows, rel_error

from loragate import kernels
from loragate.kernels import attention_cpu, decode_attention

LENS = [1, 2, 15, 16, 17, 31, 33, 70, 129, 600]


@pytest.fixture(scope="module")
def native():
    loaded = attention_cpu.native_attention()
    assert loaded is not None, (
        f"native attention did not build: {attention_cpu.native_attention_error()}"
    )
    return loaded


def decode_references(q, k_cache, v_cache, tables, lens, scale) -> list[torch.Tensor]:
    """Each sequence's float64 decode attention over its context (the slow part of a check:
    computed once per case, whatever number of outputs is checked against it)."""
    references = []
    for b, n in enumerate(lens):
        keys = context_rows(k_cache, tables[b], n)
        values = context_rows(v_cache, tables[b], n)
        references.append(attention_reference(q[b : b + 1], keys, values, scale, [n - 1]))
    return references


def check(out, q, k_cache, v_cache, tables, lens, scale, tolerance, references=None):
    assert out.shape == q.shape and out.dtype == q.dtype
    if references is None:
        references = decode_references(q, k_cache, v_cache, tables, lens, scale)
    for b, (n, expected) in enumerate(zip(lens, references, strict=True)):
        assert rel_error(out[b : b + 1], expected) < tolerance, f"sequence {b} (length {n})"


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,heads_kv", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("head_dim", [64, 40, 128])
@pytest.mark.parametrize("block_size", [16, 5])
def test_native_and_torch_decode_match_float64(
    native, dtype, tolerance, heads, heads_kv, head_dim, block_size
):
    """The native kernel on 1 and on 2 threads, and torch's, each against float64: one case
    for both thread counts (they were two cases that drew the same inputs and computed the
    same float64 references and torch output twice)."""
    torch.manual_seed(heads * 100 + head_dim + block_size)
    k_cache, v_cache, tables = build_paged_cache(LENS, heads_kv, head_dim, block_size, dtype)
    seq_lens = torch.tensor(LENS, dtype=torch.int32)
    qkv = torch.randn(len(LENS), (heads + 2 * heads_kv) * head_dim).to(dtype)
    q = qkv[:, : heads * head_dim].view(len(LENS), heads, head_dim)
    scale = 1 / math.sqrt(head_dim)
    references = decode_references(q, k_cache, v_cache, tables, LENS, scale)
    previous = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            out = native.decode(q, k_cache, v_cache, tables, seq_lens, scale)
        finally:
            torch.set_num_threads(previous)
        try:
            check(out, q, k_cache, v_cache, tables, LENS, scale, tolerance, references)
        except AssertionError as failed:
            raise AssertionError(f"native on {threads} thread(s): {failed}") from failed
    reference = decode_attention._decode_torch(q, k_cache, v_cache, tables, seq_lens, scale)
    check(reference, q, k_cache, v_cache, tables, LENS, scale, tolerance, references)


def test_the_cpu_default_runs_native_and_falls_back_to_torch(native, monkeypatch):
    k_cache, v_cache, tables = build_paged_cache([3, 40], 2, 64, 16)
    seq_lens = torch.tensor([3, 40], dtype=torch.int32)
    q = torch.randn(2, 6, 64)
    calls = []
    real = attention_cpu.NativeAttention.decode
    monkeypatch.setattr(
        attention_cpu.NativeAttention,
        "decode",
        lambda self, *args: calls.append(1) or real(self, *args),
    )
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    assert calls == [1]
    monkeypatch.setattr(decode_attention, "native_attention", lambda: None)
    fallback = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    assert calls == [1]
    assert rel_error(out, fallback) < 1e-5


def test_a_failed_build_says_why(monkeypatch, tmp_path):
    library = attention_cpu._native.Loaded(
        attention_cpu._library.source, attention_cpu.NativeAttention
    )
    monkeypatch.setattr(attention_cpu, "_library", library)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("LORAGATE_CACHE", str(tmp_path))
    assert attention_cpu.native_attention() is None
    assert "no-such-compiler" in attention_cpu.native_attention_error()
    k_cache, v_cache, tables = build_paged_cache([5], 2, 64, 16)
    q = torch.randn(1, 4, 64)
    seq_lens = torch.tensor([5], dtype=torch.int32)
    out = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    check(out, q, k_cache, v_cache, tables, [5], 0.125, 1e-5)


# (new tokens, context): short runs the native kernel takes (a whole short prompt, the last
# few tokens after a cached prefix, one token, at the limit) beside long runs torch keeps.
PREFILL_MIX = [(7, 7), (16, 16), (3, 40), (1, 23), (17, 17), (0, 9), (40, 70), (16, 600)]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads,heads_kv", [(9, 3), (8, 2)])
@pytest.mark.parametrize("block_size", [16, 5])
def test_prefill_short_runs_go_native_and_match_float64(
    native, monkeypatch, dtype, tolerance, heads, heads_kv, block_size
):
    from kernel_reference import attention_reference as reference

    from loragate.kernels import prefill_attention

    torch.manual_seed(heads + block_size)
    q_lens = [q_len for q_len, _ in PREFILL_MIX]
    contexts = [context for _, context in PREFILL_MIX]
    k_cache, v_cache, tables = build_paged_cache(contexts, heads_kv, 64, block_size, dtype)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(contexts, dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, 64).to(dtype)
    queries = []
    real = attention_cpu.NativeAttention.decode
    monkeypatch.setattr(
        attention_cpu.NativeAttention,
        "decode",
        lambda self, q, *args: queries.append(q.shape[0]) or real(self, q, *args),
    )
    out = kernels.paged_prefill_attention(q, k_cache, v_cache, tables, seq_lens, starts, 0.125)
    limit = prefill_attention.NATIVE_MAX_QUERY_LEN
    assert queries == [sum(n for n in q_lens if 0 < n <= limit)], "one native call, short runs"
    torch_only = prefill_attention._prefill_torch(
        q, k_cache, v_cache, tables, seq_lens, starts, 0.125
    )
    for result in (out, torch_only):
        assert result.shape == q.shape and result.dtype == dtype
    for b, (q_len, context) in enumerate(PREFILL_MIX):
        if q_len == 0:
            continue
        rows = slice(int(starts[b]), int(starts[b + 1]))
        keys = context_rows(k_cache, tables[b], context)
        values = context_rows(v_cache, tables[b], context)
        positions = list(range(context - q_len, context))
        expected = reference(q[rows], keys, values, 0.125, positions)  # once for both
        for name, result in (("default", out), ("torch", torch_only)):
            error = rel_error(result[rows], expected)
            assert error < tolerance, f"{name}: {q_len} of {context}"
