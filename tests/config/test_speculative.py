"""speculative_config: vLLM's keys, checked with errors that name the key and the limit."""

import pytest

from pacer.config import EngineConfig
from pacer.config.speculative import parse_speculative_config


def test_vllm_keys_and_lookup_defaults():
    c = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 4})
    assert c is not None and (c.method, c.k, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 5, 5)
    c = parse_speculative_config('{"method": "suffix", "num_speculative_tokens": 2, "prompt_lookup_max": 3}')
    assert c is not None and (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("suffix", 3, 3)
    assert parse_speculative_config(None) is None


@pytest.mark.parametrize("cfg, key", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "speculative_config.method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "speculative_config.prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}, "unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 1.5}, "speculative_config.acceptance_rate"),
])
def test_bad_config_names_the_key(cfg, key):
    with pytest.raises(ValueError, match=key):
        EngineConfig.from_kwargs(speculative_config=cfg)


def test_bad_json_and_policy():
    with pytest.raises(ValueError, match="speculative_config must be a JSON object"):
        EngineConfig.from_kwargs(speculative_config="{method: ngram")
    with pytest.raises(ValueError, match="speculative_policy must be one of adaptive, static"):
        EngineConfig.from_kwargs(speculative_policy="table")


def test_k_larger_than_the_budget_allows():
    cfg = EngineConfig.from_kwargs(speculative_config={"method": "ngram", "num_speculative_tokens": 8},
                                   max_num_batched_tokens=8)
    with pytest.raises(ValueError, match=r"num_speculative_tokens=8 is larger than the budget allows.*"
                                         r"max_num_batched_tokens=8 leaves room for at most 7"):
        cfg.scheduler.resolved(2048)
    cfg.scheduler.max_num_batched_tokens = 9
    assert cfg.scheduler.resolved(2048).max_num_batched_tokens == 9


def test_cli_flag_takes_json():
    import argparse

    from pacer.config.args import add_engine_args, engine_kwargs_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
                         "--speculative-policy", "static"])
    cfg = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    spec = cfg.scheduler.speculative()
    assert spec is not None and spec.k == 3 and cfg.scheduler.speculative_policy == "static"
