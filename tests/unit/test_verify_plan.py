"""Planning a verification without launching it (torch-free): config mapping, modes, validation evidence."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moe_overlap.verify.judge.criteria import criterion_validation
from moe_overlap.verify.plan.build import VerifyInputError, make_plan, validate_modes
from moe_overlap.verify.plan.config import VerifyConfig, load_verify_config
from moe_overlap.verify.plan.options import VerifyOptions


def test_default_plan(tmp_path):
    plan = make_plan(VerifyOptions(out=tmp_path))
    assert plan.config_kind == "default" and plan.nproc == 2
    assert [s.name for s in plan.specs] == ["baseline", "overlap", "overlap+wgrad"]
    assert [s.schedule for s in plan.specs] == ["none", "1f1b", "1f1b"]


def test_default_validation_waives_fp32_only_for_our_implementation(tmp_path):
    ev = validate_modes(make_plan(VerifyOptions(out=tmp_path)))
    assert ev["available"]
    assert {w["rule"] for w in ev["waived"]} == {"precision-bf16-or-fp16"}
    assert criterion_validation(ev).status == "pass"


def test_invalid_megatron_config_fails_criterion_1(tmp_path):
    cfg = {"model": {"expert_model_parallel_size": 2, "num_moe_experts": 8, "moe_token_dispatcher_type": "alltoall",
                     "bf16": True, "recompute_granularity": "full", "recompute_method": "uniform",
                     "recompute_num_layers": 1},
           "comm_overlap": {"overlap_moe_expert_parallel_comm": True}}
    plan = make_plan(VerifyOptions(config=cfg, out=tmp_path))
    assert plan.config_kind == "megatron"
    assert any("recompute_granularity" in n for n in plan.mapping_notes)
    crit = criterion_validation(validate_modes(plan))
    assert crit.status == "fail" and "no-full-recompute" in crit.summary
    # the fp32 waiver never applies to a Megatron config: Megatron would reject it
    cfg["model"].update(bf16=False, recompute_granularity=None, recompute_method=None, recompute_num_layers=None)
    crit = criterion_validation(validate_modes(make_plan(VerifyOptions(config=cfg, out=tmp_path))))
    assert crit.status == "fail" and "precision-bf16-or-fp16" in crit.summary


def test_own_format_round_trip(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("format: moe-overlap\nnum_moe_experts: 8\nprecision: bf16\nsteps: 5\nschedule: chunked\n")
    loaded = load_verify_config(str(path))
    assert loaded.kind == "moe-overlap" and not loaded.notes and loaded.cfg.num_moe_experts == 8
    assert loaded.parsed is None
    plan = make_plan(VerifyOptions(config=str(path), out=tmp_path / "o", micro_batches=3))
    assert plan.cfg.micro_batches == 3 and plan.cfg.steps == 5
    assert [s.schedule for s in plan.specs] == ["none", "chunked"]  # delayed wgrad needs 1f1b: left out
    assert any("overlap+wgrad skipped" in n for n in plan.notes)


@pytest.mark.parametrize("text,field", [
    ("format: moe-overlap\nmoe_router_topk: 9\n", "moe_router_topk"),
    ("format: moe-overlap\nprecision: fp8\n", "precision"),
    ("format: moe-overlap\nhiden_size: 32\n", "hiden_size"),
])
def test_bad_own_config_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(VerifyInputError) as err:
        make_plan(VerifyOptions(config=str(path), out=tmp_path / "o"))
    assert field in err.value.message


def test_megatron_view_is_what_the_validator_reads():
    view = VerifyConfig(precision="bf16").megatron_view()
    assert view["model"]["bf16"] is True and view["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True


def test_planning_is_torch_free(tmp_path):
    code = ("import sys; from moe_overlap.verify.plan.build import make_plan, validate_modes; "
            "from moe_overlap.verify.plan.options import VerifyOptions; import moe_overlap.verify.api; "
            f"validate_modes(make_plan(VerifyOptions(out={str(tmp_path)!r}))); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("content, expected", [
    (None, "adir: is a directory, not a config file"),
    (b"\x00\x01binary", "adir: binary file (NUL bytes)"),
    (b"", "adir: empty config"),
])
def test_unreadable_config_file_one_message_naming_it_once(tmp_path, content, expected):
    from moe_overlap.verify.plan.config import VerifyConfigError

    path = tmp_path / "adir"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(VerifyConfigError) as err:
        load_verify_config(path)
    message = str(err.value)
    assert message.startswith(str(tmp_path / expected)) and message.count("adir") == 1


def test_unwritable_out_is_bad_input_before_launch(tmp_path):
    from moe_overlap.verify.plan.build import prepare_out

    (tmp_path / "file").write_text("not a folder")
    plan = make_plan(VerifyOptions(out=tmp_path / "file" / "run"))
    with pytest.raises(VerifyInputError, match="cannot write there") as err:
        prepare_out(plan)
    assert err.value.field == "out"
    ok = make_plan(VerifyOptions(out=tmp_path / "run"))
    assert prepare_out(ok).read_text().startswith("{")


def test_cli_unwritable_out_exits_2_without_traceback(tmp_path, capsys):
    from moe_overlap.cli import main

    (tmp_path / "file").write_text("not a folder")
    assert main(["verify", "--out", str(tmp_path / "file" / "run")]) == 2
    err = capsys.readouterr().err
    assert "cannot write there" in err and "Traceback" not in err


def test_damaged_rank_records_are_skipped_like_torn_lines(tmp_path):
    from moe_overlap.verify.run.records import RecordWriter, read_all

    path = tmp_path / "rank0.jsonl"
    writer = RecordWriter(path)
    writer.emit("hello", rank=0)
    writer.close()
    with path.open("a", encoding="utf-8") as f:
        f.write('garbage\n5\n["list"]\n{"kind": 5}\n{"kind": "step"}\n{"kind": "done", "t": 1.0}\n{"kind": "to')
    assert [r["kind"] for r in read_all(path)] == ["hello", "done"]


def test_judge_of_a_folder_with_damaged_records_reports_instead_of_raising(tmp_path, capsys):
    from moe_overlap.cli import main

    out = tmp_path / "run"
    assert main(["verify", "--print-launch", "torchrun", "--out", str(out)]) == 0
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / "rank0.jsonl").write_text('garbage\n{"kind": 5}\n{"no_time": true, "kind": "done"}\n')
    capsys.readouterr()
    assert main(["verify", "--judge", str(out)]) == 1
    captured = capsys.readouterr()
    assert "stopped without finishing" in captured.out and "Traceback" not in captured.err


_MEGATRON_SOURCES = {
    "flat-megatron": {"expert_model_parallel_size": 2, "num_moe_experts": 8, "moe_router_topk": 2, "bf16": True,
                      "overlap_moe_expert_parallel_comm": True, "hidden_size": 2048, "seq_length": 512},
    "unknown-and-renamed": {"model": {"expert_model_parallel_size": 2, "num_moe_experts": 4, "fp16": True,
                                      "cuda_graph_modules": ["attn"], "moe_tokn_dispatcher": "flex"},
                            "comm_overlap": {"delay_wgrad_compute": True}, "optimiser_settings": {"lr": 1e-4},
                            "mixed_precision": "bf16_mixed"},
}


@pytest.mark.parametrize("name", ["ep-overlap-alltoall.yaml", "ep-overlap-flex-deepep.yaml",
                                  "ep-overlap-minimal.yaml", *_MEGATRON_SOURCES])
def test_one_pass_validates_what_parsing_the_source_with_mode_overrides_would(tmp_path, name, monkeypatch):
    """Criterion 1 reuses the parse of the source (never re-read); its findings are those of validating the
    source itself with the mode's overlap switches given as overrides, notes of the first parse included."""
    from moe_overlap.paths import data_root
    from moe_overlap.skill.rules.validate import validate_config
    from moe_overlap.verify.plan import config as verify_config

    source = _MEGATRON_SOURCES.get(name) or str(data_root() / "examples" / name)
    calls = {"read": 0, "parse": 0}

    def counted(key, fn):
        def wrapper(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapper

    monkeypatch.setattr(verify_config, "read_file", counted("read", verify_config.read_file))
    monkeypatch.setattr(verify_config, "parse_config", counted("parse", verify_config.parse_config))
    plan = make_plan(VerifyOptions(config=source, out=tmp_path / "o", nproc=1))
    evidence = validate_modes(plan)
    assert plan.config_kind == "megatron"
    assert calls == {"read": 0 if isinstance(source, dict) else 1, "parse": 1}
    assert set(evidence["results"]) == {s.name for s in plan.specs if s.overlap}
    for spec in plan.specs:
        if not spec.overlap:
            continue
        overrides = [f"comm_overlap.overlap_moe_expert_parallel_comm={str(spec.overlap).lower()}",
                     f"comm_overlap.delay_wgrad_compute={str(spec.delay_wgrad).lower()}"]
        direct = validate_config(source, overrides=overrides).model_dump(mode="json")
        direct["valid"] = not any(f["severity"] == "error" for f in direct["findings"])
        assert evidence["results"][spec.name] == direct, spec.name
    if name == "unknown-and-renamed":
        kinds = {f["rule"] for r in evidence["results"].values() for f in r["findings"]}
        assert {"config:unknown-key", "config:renamed-field"} <= kinds


def test_validation_leaves_the_callers_config_untouched(tmp_path):
    source = {"model": {"expert_model_parallel_size": 2, "num_moe_experts": 4, "bf16": True},
              "comm_overlap": {"overlap_moe_expert_parallel_comm": False}}
    before = repr(source)
    validate_modes(make_plan(VerifyOptions(config=source, out=tmp_path)))
    assert repr(source) == before


@pytest.mark.parametrize("kind", ["dict", "path", "default"])
def test_offline_judge_validates_what_the_launch_plan_did(tmp_path, kind):
    from moe_overlap.paths import data_root
    from moe_overlap.verify.judge.offline import _load_plan, write_plan

    source = {"dict": _MEGATRON_SOURCES["unknown-and-renamed"],
              "path": str(data_root() / "examples" / "ep-overlap-alltoall.yaml"), "default": None}[kind]
    plan = make_plan(VerifyOptions(config=source, out=tmp_path, nproc=2), local=False)
    write_plan(plan)
    assert validate_modes(_load_plan(tmp_path)) == validate_modes(plan)


def test_offline_judge_with_a_vanished_source_is_bad_input(tmp_path):
    from moe_overlap.verify.judge.offline import _load_plan, write_plan

    path = tmp_path / "megatron.yaml"
    path.write_text("model:\n  expert_model_parallel_size: 2\n  num_moe_experts: 4\n  bf16: true\n")
    write_plan(make_plan(VerifyOptions(config=str(path), out=tmp_path / "o"), local=False))
    path.unlink()
    with pytest.raises(VerifyInputError) as err:
        _load_plan(tmp_path / "o")
    assert "config file not found" in err.value.message
