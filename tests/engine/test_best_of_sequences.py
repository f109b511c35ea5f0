"""best_of > n returns the n likeliest samples and, once finished, every other candidate
in `best_of_sequences` (what TGI and LoRAX report), likeliest first."""

from __future__ import annotations

import pytest

from loragate.engine import SamplingParams


@pytest.fixture(scope="module")
def llm(make_llm, tiny_model_dir):
    return make_llm(str(tiny_model_dir()), max_model_len=256, max_num_seqs=8, num_kv_blocks=64)


def sampled(n: int, best_of: int) -> SamplingParams:
    return SamplingParams(n=n, best_of=best_of, temperature=1.0, seed=7, max_tokens=8, logprobs=0)


def test_every_candidate_comes_back_and_the_kept_ones_are_likeliest(llm):
    (out,) = llm.generate(["Once upon a time"], sampled(2, 5), use_tqdm=False)
    kept, others = out.outputs, out.best_of_sequences
    assert len(kept) == 2 and len(others) == 3
    assert sorted(c.index for c in kept + others) == list(range(5))
    scores = [c.cumulative_logprob for c in kept + others]
    assert scores == sorted(scores, reverse=True)
    for c in others:  # a whole sample: its text, tokens, their logprobs, why it ended
        assert c.finish_reason in ("stop", "length") and c.token_ids and c.text
        assert c.cumulative_logprob == pytest.approx(
            sum(step[t] for t, step in zip(c.token_ids, c.logprobs, strict=True)), abs=1e-4
        )
    # The candidates are the samples best_of draws: n = best_of gives the same ones.
    (every,) = llm.generate(["Once upon a time"], sampled(5, 5), use_tqdm=False)
    assert every.best_of_sequences is None
    assert sorted(tuple(c.token_ids) for c in every.outputs) == sorted(
        tuple(c.token_ids) for c in kept + others
    )


def test_no_candidates_without_best_of(llm):
    (out,) = llm.generate(["Once upon a time"], sampled(2, 2), use_tqdm=False)
    assert out.best_of_sequences is None
