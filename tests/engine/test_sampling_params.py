"""SamplingParams: defaults, normalisation, and one clear error per bad value."""

import pytest

from loragate.engine.sampling.sampling_params import SamplingParams


def test_defaults_mirror_vllm():
    params = SamplingParams()
    assert params.n == 1 and params.best_of == 1
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == 0
    assert params.min_p == 0.0 and params.repetition_penalty == 1.0
    assert params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
    assert params.max_tokens == 16 and params.min_tokens == 0
    assert params.stop == [] and params.stop_token_ids == []
    assert params.logprobs is None and params.seed is None
    assert params.skip_special_tokens and params.spaces_between_special_tokens
    assert not params.ignore_eos and not params.include_stop_str_in_output
    assert not params.use_beam_search and params.sampler is None
    assert not params.greedy and not params.has_penalties


def test_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]
    assert SamplingParams(stop_token_ids=(5, 7)).stop_token_ids == [5, 7]


def test_best_of_defaults_to_n():
    assert SamplingParams(n=3).best_of == 3
    assert SamplingParams(n=2, best_of=5).best_of == 5


def test_max_tokens_none_means_until_the_context_is_full():
    assert SamplingParams(max_tokens=None, min_tokens=100).max_tokens is None


def test_integer_floats_are_accepted():
    params = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert isinstance(params.temperature, float) and params.repetition_penalty == 2.0


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1e-7),
        SamplingParams(temperature=0.8, top_k=1),
    ],
)
def test_greedy(params):
    assert params.greedy


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.5), SamplingParams(top_k=2), SamplingParams(top_k=-1)],
)
def test_not_greedy(params):
    assert not params.greedy


@pytest.mark.parametrize(
    "field, value",
    [("presence_penalty", 0.1), ("frequency_penalty", -0.3), ("repetition_penalty", 1.2)],
)
def test_has_penalties(field, value):
    assert SamplingParams(**{field: value}).has_penalties


BAD_VALUES = [
    ({"n": 0}, "n must"),
    ({"n": 1.5}, "n must"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.2}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 3.5}, "top_k"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": 1.1}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty"),
    ({"logprobs": -1}, "logprobs"),
    ({"logprobs": 1.5}, "logprobs"),
    ({"seed": "abc"}, "seed"),
    ({"seed": 1.0}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop_token_ids": [3, -1]}, "stop_token_ids"),
    ({"stop_token_ids": [3, "x"]}, "stop_token_ids"),
    ({"stop_token_ids": 3}, "stop_token_ids"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"early_stopping": True}, "early_stopping"),
    ({"early_stopping": "sometimes", "use_beam_search": True}, "early_stopping"),
    ({"use_beam_search": True, "temperature": 0.0}, "best_of"),
    ({"use_beam_search": True, "best_of": 4, "temperature": 0.0, "top_p": 0.9}, "top_p"),
    # Beam search takes any temperature and top_k (issue 24): tests/engine/test_beam_temperature.py
    ({"use_beam_search": True, "best_of": 4, "temperature": 0.0, "min_p": 0.1}, "min_p"),
    ({"sampler": ""}, "sampler"),
    ({"sampler": 3}, "sampler"),
    ({"sampler": "mirostat", "sampler_args": [1]}, "sampler_args"),
    ({"sampler_args": {"tau": 5.0}}, "sampler_args"),
]


@pytest.mark.parametrize("kwargs, field", BAD_VALUES, ids=[str(k) for k, _ in BAD_VALUES])
def test_bad_value_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_valid_beam_search():
    params = SamplingParams(
        use_beam_search=True, best_of=4, temperature=0.0, length_penalty=0.8, early_stopping=True
    )
    assert params.greedy and params.best_of == 4


def test_plugin_sampler_with_args():
    params = SamplingParams(sampler="mirostat", sampler_args={"tau": 5.0})
    assert params.sampler_args == {"tau": 5.0}


def test_clone_is_deep():
    params = SamplingParams(stop=["a"], stop_token_ids=[7], sampler="s", sampler_args={"x": [1]})
    copy = params.clone()
    assert copy == params and copy is not params
    copy.stop.append("b")
    copy.stop_token_ids.append(8)
    copy.sampler_args["x"].append(2)
    assert params.stop == ["a"] and params.stop_token_ids == [7]
    assert params.sampler_args == {"x": [1]}


@pytest.mark.parametrize("seed", [-1, 2**63, 10**30])
def test_seed_outside_the_generator_range(seed):
    with pytest.raises(ValueError, match="seed must be an integer in"):
        SamplingParams(seed=seed)
