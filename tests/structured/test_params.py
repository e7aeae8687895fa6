"""StructuredOutputsParams (vLLM's names) and the engine's structured-output options: types
checked up front, each error naming the field."""

from __future__ import annotations

import argparse
import json

import pytest

from pacer.config import EngineConfig
from pacer.config.args import add_engine_args, engine_kwargs_from_args
from pacer.request import SamplingParams, StructuredOutputsParams


def test_exactly_one_constraint():
    assert StructuredOutputsParams(regex="a+").kind == "regex"
    assert StructuredOutputsParams(json_object=True).spec() == {"kind": "json_object", "value": True, "compact": True}
    with pytest.raises(ValueError, match="exactly one of .* got regex, choice"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="got none"):
        StructuredOutputsParams()


@pytest.mark.parametrize("kwargs,words", [
    ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
    ({"json": [1]}, "structured_outputs.json must be a JSON schema object"),
    ({"choice": "abc"}, "structured_outputs.choice must be a list"),
    ({"choice": []}, "structured_outputs.choice must be a non-empty list"),
    ({"regex": ""}, "structured_outputs.regex must be a non-empty string"),
    ({"grammar": 5}, "structured_outputs.grammar must be a non-empty string"),
])
def test_bad_types_name_the_field(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words):
        StructuredOutputsParams(**kwargs)


def test_cache_key_is_content():
    a = StructuredOutputsParams(json={"type": "object", "required": ["a"]})
    b = StructuredOutputsParams(json='{"required": ["a"], "type": "object"}')
    assert a.cache_key() == b.cache_key()
    assert a.cache_key() != StructuredOutputsParams(json={"type": "object"}, disable_any_whitespace=False).cache_key()


def test_sampling_params_carries_it():
    sp = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["x"]))
    assert sp.for_sample(1).structured_outputs == sp.structured_outputs
    with pytest.raises(TypeError, match="structured_outputs must be StructuredOutputsParams"):
        SamplingParams(structured_outputs={"choice": ["x"]})  # type: ignore[arg-type]


def test_timeout_flag_and_validation():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    kw = engine_kwargs_from_args(p.parse_args(["--structured-outputs-timeout", "1.5"]))
    assert EngineConfig.from_kwargs(**kw).structured.structured_outputs_timeout == 1.5
    with pytest.raises(ValueError, match="structured_outputs_timeout must be a number of seconds > 0"):
        EngineConfig.from_kwargs(structured_outputs_timeout=0)
    with pytest.raises(ValueError, match="structured_outputs_workers must be >= 1"):
        EngineConfig.from_kwargs(structured_outputs_workers=0)


TAG = {"structures": [{"begin": "<function=f>", "schema": {"type": "object"}, "end": "</function>"}],
       "triggers": ["<function="]}


def test_structural_tag_both_spellings_normalize_to_one():
    new = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<function="], "tags": [
        {"begin": "<function=f>", "content": {"type": "json_schema", "json_schema": {"type": "object"}},
         "end": "</function>"}]}}
    a = StructuredOutputsParams(structural_tag={"type": "structural_tag", **TAG})
    b = StructuredOutputsParams(structural_tag=new)
    c = StructuredOutputsParams(structural_tag=json.dumps(TAG))
    assert a.kind == "structural_tag" and a.structural_tag == TAG
    assert a.cache_key() == b.cache_key() == c.cache_key()


@pytest.mark.parametrize("tag,field", [
    ({**TAG, "triggers": ["<tool="]}, "structured_outputs.structural_tag.structures[0].begin"),
    ({**TAG, "triggers": [""]}, "structured_outputs.structural_tag.triggers"),
    ({**TAG, "structures": [{"begin": "<function=f>", "schema": [], "end": ""}]},
     "structured_outputs.structural_tag.structures[0].schema"),
    ({**TAG, "structures": [{"begin": "<function=f>", "schema": {}}]},
     "structured_outputs.structural_tag.structures[0].end"),
    ({"format": {"type": "triggered_tags", "triggers": ["<"], "tags": [{"begin": "<a>", "content": {}, "end": ""}]}},
     "structured_outputs.structural_tag.format.tags[0].content"),
    ({"format": {"type": "triggered_tags", "triggers": ["<"], "stop_after_first": True, "tags": []}},
     "structured_outputs.structural_tag.format.stop_after_first"),
    ("{", "structured_outputs.structural_tag"),
])
def test_bad_structural_tags_name_the_field(tag, field):
    with pytest.raises((ValueError, TypeError)) as e:
        StructuredOutputsParams(structural_tag=tag)
    assert e.value.field == field and field in str(e.value)
