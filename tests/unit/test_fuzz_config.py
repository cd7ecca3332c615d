"""Fuzzing the config parser: no input crashes it, and every bad input is a ConfigError naming the field."""

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.config.model import ModelSection, OverlapConfig, parse_config
from moe_overlap.skill.rules.validate import validate_config

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)
model_keys = st.sampled_from(sorted(ModelSection.model_fields) + ["cuda_graph_modules", "unknown_key"])


def _parses_or_config_error(call):
    try:
        result = call()
    except ConfigError as exc:
        assert exc.message and "Traceback" not in exc.message
        return None
    return result


@FUZZ
@given(st.text(max_size=300))
def test_any_text_parses_or_raises_config_error(text):
    result = _parses_or_config_error(lambda: parse_config(text + "\n"))
    assert result is None or isinstance(result, OverlapConfig)


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes_in_a_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_bytes(data)
    result = _parses_or_config_error(lambda: parse_config(path))
    assert result is None or isinstance(result, OverlapConfig)


@FUZZ
@given(st.dictionaries(st.sampled_from(["model", "comm_overlap", "ddp", "train", "mixed_precision", "other"]),
                       values, max_size=4))
def test_any_nested_data_validates_or_raises(data):
    result = _parses_or_config_error(lambda: validate_config(data, detect=False, env={}))
    assert result is None or isinstance(result.valid, bool)


@FUZZ
@given(model_keys, values)
def test_a_bad_field_value_names_the_field(key, value):
    try:
        parse_config({"model": {key: value}})
    except ConfigError as exc:
        name = "cuda_graph_scope" if key == "cuda_graph_modules" else key
        assert exc.field is not None and (name in exc.field or key in exc.field), (exc.field, exc.message)
        assert name in exc.message or key in exc.message


@FUZZ
@given(model_keys, values)
def test_yaml_round_trip_of_bad_values_names_the_field(key, value):
    try:
        text = yaml.safe_dump({"model": {key: value}})
    except yaml.YAMLError:
        return
    try:
        parse_config(text)
    except ConfigError as exc:
        name = "cuda_graph_scope" if key == "cuda_graph_modules" else key
        assert name in exc.message or key in exc.message, exc.message


@FUZZ
@given(st.lists(st.text(max_size=40), max_size=4))
def test_any_overrides(overrides):
    result = _parses_or_config_error(lambda: parse_config({}, overrides))
    assert result is None or isinstance(result, OverlapConfig)


flags = st.sampled_from(["--bf16", "--expert-model-parallel-size", "--num-experts", "--recompute-modules",
                         "--moe-token-dispatcher-type", "--cuda-graph-scope", "--mtp-num-layers", "--x", "8",
                         "moe", "alltoall", "--lr=1", "=", "--bf16=1", ""])


@FUZZ
@given(st.lists(st.one_of(flags, st.text(max_size=10)), max_size=8))
def test_any_megatron_argv(tokens):
    result = _parses_or_config_error(lambda: parse_config(argv=tokens))
    assert result is None or isinstance(result, OverlapConfig)
