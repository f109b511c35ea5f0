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


def test_step_gives_a_seeded_row_fresh_draws(plugins):
    logits = torch.zeros(1, 1000)  # uniform: repeated ids across 8 steps would be a fluke
    draws = {
        int(plugins.call_sampler("random", logits, [{"seed": 3, "step": step}])[0])
        for step in range(8)
    }
    assert len(draws) > 1


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


def test_unseeded_rows_still_sample(plugins):
    torch.manual_seed(0)
    logits = torch.zeros(1, 1000)
    draws = {int(plugins.call_sampler("random", logits, [{}])[0]) for _ in range(5)}
    assert len(draws) > 1


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
