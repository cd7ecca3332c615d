"""Hostile config input (issue 15): every case is a ConfigError naming the line or field, fast, never a traceback."""

from __future__ import annotations

import os
import time

import pytest

from moe_overlap.skill.config.load import MAX_DEPTH, MAX_NODES, ConfigError, parse_text, read_file
from moe_overlap.skill.config.model import looks_like_config, parse_config

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8)) + "model: *i\n"


def _quick(call, limit_s: float = 2.0):
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        call()
    assert time.monotonic() - t0 < limit_s
    assert "Traceback" not in err.value.message
    return err.value


@pytest.mark.parametrize("text,words", [
    ("model: !!int 0x\n", "line 1, column 8: this int value cannot be read"),
    ("model:\n  bf16: !!bool maybe\n", "line 2"),
    ("model: !!timestamp nope\n", "timestamp value cannot be read"),
    ("model:\n  num_moe_experts: 2024-02-31\n", "line 2"),
    ("model:\n  num_moe_experts: " + "9" * 5000 + "\n", "line 2"),
    ("model:\n  num_moe_experts: !!float x\n", "float value cannot be read"),
    ("model: {x: !!binary aGVsbG8=}\n", "model.x: a bytes value"),
    ("model: {x: !!set {1, 2}}\n", "model.x: a set value"),
    ("model: {x: .inf}\n", "model.x: inf is not a finite number"),
    ("model: {x: .nan}\n", "model.x: nan is not a finite number"),
    ("model: {x: " + "9" * 30 + "}\n", "model.x: the integer is out of range"),
    (ALIAS_BOMB, "anchors and aliases"),
    ("model: &m {bf16: true}\nddp: {x: 1}\n", "anchors and aliases"),
    ("model: [" + ",".join(["1"] * (MAX_NODES + 5)) + "]\n", f"more than {MAX_NODES} values"),
    ("model: " + "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2) + "\n", "nested more than"),
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
])
def test_yaml_that_cannot_be_built_is_a_config_error(text, words):
    err = _quick(lambda: parse_config(text))
    assert words in err.message, err.message


@pytest.mark.parametrize("text,words", [
    ('{"model": {"x": 1e400}}', "model.x: inf is not a finite number"),
    ('{"model": {"x": NaN}}', "NaN is not a number JSON allows"),
    ('{"model": {"x": -Infinity}}', "-Infinity is not a number JSON allows"),
    ('{"model": {"x": ' + "1" * 5000 + "}}", "a value cannot be read"),
    ('{"model": ' + "[" * 3000 + "]" * 3000 + "}", "nested"),
])
def test_json_out_of_range_is_a_config_error(text, words):
    err = _quick(lambda: parse_text(text, fmt="json"))
    assert words in err.message, err.message


def test_a_one_megabyte_flow_list_is_refused_quickly():
    _quick(lambda: parse_config("model: [" + ",".join(["1"] * 400_000) + "]\n"), limit_s=5)


@pytest.mark.parametrize("field,value", [("expert_model_parallel_size", 10**9), ("num_moe_experts", 10**12),
                                         ("tensor_model_parallel_size", 2**64), ("recompute_num_layers", 10**7)])
def test_every_count_has_a_maximum(field, value):
    err = _quick(lambda: parse_config({"model": {field: value}}))
    assert err.field == f"model.{field}"
    assert "less than or equal" in err.message or "out of range" in err.message


def test_override_values_are_bounded_too():
    err = _quick(lambda: parse_config({}, ["model.x=[&a [1, 2], *a]"]))
    assert "anchors and aliases" in err.message and err.field == "model.x"
    err = _quick(lambda: parse_config({}, ["model.num_moe_experts=" + "9" * 5000]))
    assert err.field == "model.num_moe_experts"
    err = _quick(lambda: parse_config({}, [".".join(["a"] * 100) + "=1"]))
    assert "nested more than" in err.message


def test_a_dict_source_is_checked_and_not_modified():
    data = {"model": {"num_moe_experts": 8}, "other": {"x": float("nan")}}
    err = _quick(lambda: parse_config(data))
    assert err.field == "other.x"
    nested: dict = {}
    inner = nested
    for _ in range(200):
        inner["a"] = {}
        inner = inner["a"]
    _quick(lambda: parse_config({"model": {}, "extra": nested}))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    err = _quick(lambda: parse_config(fifo))
    assert "FIFO" in err.message and "regular" in err.message


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_are_refused(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    err = _quick(lambda: parse_config(device))
    assert "character device" in err.message


def test_a_directory_is_refused(tmp_path):
    assert "directory" in _quick(lambda: parse_config(tmp_path)).message


def test_unrelated_files_are_refused_without_echoing_them(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\nuser: secret-token\n")
    err = _quick(lambda: parse_config(secret))
    assert "not read as a training config" in err.message
    assert "hash" not in err.message and "secret" not in err.message.replace(str(secret), "")
    kv = tmp_path / "credentials"
    kv.write_text("aws_secret_access_key: AKIAXXXX\nregion: us-east-1\n")  # a mapping, but no config key
    err = _quick(lambda: parse_config(kv))
    assert "AKIA" not in err.message
    if os.path.exists("/etc/shadow"):
        err = _quick(lambda: parse_config("/etc/shadow"))
        assert "root" not in err.message.replace("/etc/shadow", "")


def test_a_config_without_a_config_suffix_is_read_when_it_is_one(tmp_path):
    cfg = tmp_path / "job.conf"
    cfg.write_text("model:\n  expert_model_parallel_size: 4\n")
    assert parse_config(cfg).model.expert_model_parallel_size == 4
    assert looks_like_config({"comm_overlap": {}}) and not looks_like_config({"user": 1})
    assert read_file(cfg, recognised=looks_like_config) == {"model": {"expert_model_parallel_size": 4}}
