"""The built-in "greedy" and "random" samplers, called through the plugin manager."""

from __future__ import annotations

import pytest
import torch

from loragate.plugins import PluginError, PluginManager


@pytest.fixture(scope="module")
def plugins():
    return PluginManager.create(load_entrypoints=False)


def test_greedy_is_the_argmax_with_the_lowest_id_among_ties(plugins):
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 0.0], [-3.0, -2.0, -9.0, -2.5]])
    assert plugins.call_sampler("greedy", logits, [{}, {}, {}]).tolist() == [1, 0, 1]


def test_random_with_temperature_zero_is_greedy(plugins):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    tokens = plugins.call_sampler("random", logits, [{"temperature": 0}] * 4)
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch(plugins):
    generator = torch.Generator().manual_seed(1)
    row = torch.randn(1, 100, generator=generator)
    others = torch.randn(5, 100, generator=generator)
    alone = plugins.call_sampler("random", row, [{"seed": 7}])
    batch = torch.cat([others[:2], row, others[2:]])
    args = [{}, {"seed": 1}, {"seed": 7}, {}, {"seed": 2}, {}]
    in_batch = plugins.call_sampler("random", batch, args)
    assert in_batch[2] == alone[0]
    again = plugins.call_sampler("random", row, [{"seed": 7}])
    assert again.tolist() == alone.tolist()


def test_step_gives_a_seeded_row_fresh_draws_from_the_softmax(plugins):
    """Step s of one seed is a fresh draw: over many steps the ids follow the softmax, and
    another seed gives another sequence of ids."""
    logits = torch.tensor([1.0, 0.0, 0.5, -1.0, 2.0, 0.0, -0.5, 1.5])
    steps = 4000
    rows = logits.expand(steps, -1)
    draws = plugins.call_sampler("random", rows, [{"seed": 3, "step": s} for s in range(steps)])
    frequencies = torch.bincount(draws, minlength=8) / steps
    # 4000 draws: one standard deviation of a frequency is at most 0.008.
    assert torch.allclose(frequencies, torch.softmax(logits, -1), atol=0.04), frequencies
    other = plugins.call_sampler("random", rows[:64], [{"seed": 4, "step": s} for s in range(64)])
    assert other.tolist() != draws[:64].tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_random_draws_follow_the_tempered_softmax(plugins, temperature):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    expected = torch.softmax(logits[0] / temperature, dim=-1)
    counts = torch.zeros(4)
    draws = 4000
    for step in range(draws):
        token = plugins.call_sampler(
            "random", logits, [{"seed": 11, "step": step, "temperature": temperature}]
        )
        counts[token[0]] += 1
    frequencies = counts / draws
    # 4000 draws: one standard deviation of a frequency is at most 0.008.
    assert torch.allclose(frequencies, expected, atol=0.04), (frequencies, expected)


def test_unseeded_rows_sample_the_tempered_softmax(plugins):
    """Rows without a seed draw from the global generator, each row its own draw."""
    torch.manual_seed(0)
    logits = torch.tensor([0.5, -1.0, 1.0, 0.0, 2.0])
    rows = logits.expand(4000, -1)
    draws = plugins.call_sampler("random", rows, [{"temperature": 2.0}] * 4000)
    frequencies = torch.bincount(draws, minlength=5) / 4000
    assert torch.allclose(frequencies, torch.softmax(logits / 2.0, -1), atol=0.04), frequencies


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"temperature": -1.0}, "temperature must be a number >= 0"),
        ({"temperature": "hot"}, "temperature must be a number >= 0"),
        ({"seed": -5}, "seed must be an integer >= 0"),
        ({"seed": 1, "step": 1.5}, "step must be an integer >= 0"),
    ],
)
def test_bad_random_args_fail_naming_the_builtin(plugins, args, message):
    with pytest.raises(
        PluginError, match=f"of plugin 'builtin.samplers' raised ValueError: .*{message}"
    ):
        plugins.call_sampler("random", torch.zeros(1, 5), [args])
