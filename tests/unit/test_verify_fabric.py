"""--fabric and --a2a of a verification run: refused where they mean nothing, carried to every rank and into the
torchrun command, recorded in plan.json for --judge (torch-free)."""

from __future__ import annotations

import json

import pytest

from moe_overlap.ep.fabric import fabric_env
from moe_overlap.verify.api import options_command
from moe_overlap.verify.judge.offline import _load_plan
from moe_overlap.verify.plan.build import VerifyInputError, make_plan, prepare_out
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.plan.plan_file import save_plan
from moe_overlap.verify.run.launch_print import rank_environment, torchrun_command, worker_options
from moe_overlap.verify.run.launcher import _rank_env


@pytest.mark.parametrize("opts,field", [({"fabric": "emulated-net"}, "fabric"), ({"a2a": "ce"}, "a2a"),
                                        ({"sm_margin": 8}, "sm_margin")])
def test_cuda_only_options_are_refused_on_cpu(tmp_path, opts, field):
    with pytest.raises(VerifyInputError) as err:
        make_plan(VerifyOptions(out=tmp_path / "o", **opts))
    assert err.value.field == field and "--device cuda" in err.value.message


def test_defaults_add_nothing(tmp_path):
    plan = make_plan(VerifyOptions(out=tmp_path / "o", a2a="auto"))  # auto on CPU: gloo, allowed
    assert plan.fabric == "native" and worker_options(plan) == ["--a2a", "auto"] and rank_environment(plan) == {}
    assert torchrun_command(plan).startswith("torchrun ")


def test_fabric_reaches_every_rank_and_the_torchrun_command(tmp_path):
    plan = make_plan(VerifyOptions(out=tmp_path / "o", nproc=2), local=False)
    plan.fabric, plan.a2a, plan.explain, plan.device = "emulated-net", "ce", False, "cuda"
    plan.sm_margin = 16
    env = rank_environment(plan)
    assert env == fabric_env("emulated-net") and env["NCCL_P2P_DISABLE"] == "1"
    assert _rank_env(1, 2, 29500, 1, env)["NCCL_SHM_DISABLE"] == "1"
    cmd = torchrun_command(plan)
    assert cmd.startswith("NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=4") and " torchrun " in cmd
    assert cmd.endswith("--device cuda --fabric emulated-net --a2a ce --sm-margin 16 --no-explain")
    prepare_out(plan)  # the run's own folder (marker, config.json), as --print-launch makes it
    save_plan(plan)
    again = _load_plan(tmp_path / "o")
    assert (again.fabric, again.a2a, again.explain, again.sm_margin) == ("emulated-net", "ce", False, 16)
    data = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert data["fabric"] == "emulated-net"


def test_command_line_names_the_options():
    cmd = options_command(VerifyOptions(device="cuda", fabric="emulated-net", a2a="auto", explain=False))
    assert cmd.endswith("--device cuda --fabric emulated-net --a2a auto --no-explain")
    cmd = options_command(VerifyOptions(device="cuda", sm_margin=12))
    assert cmd.endswith("--device cuda --sm-margin 12")


@pytest.mark.parametrize("bad", [-1, 1025, "8", True, 2.5, "some"])
def test_bad_sm_margin_is_refused_naming_the_field(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        VerifyOptions(sm_margin=bad)
    assert err.value.errors()[0]["loc"][0] == "sm_margin"


def test_cli_sm_margin_errors_name_the_flag(tmp_path, capsys):
    from moe_overlap.cli import main

    assert main(["verify", "--sm-margin", "lots", "--out", str(tmp_path / "o")]) == 2
    assert "--sm-margin 'lots'" in capsys.readouterr().err
    assert main(["verify", "--sm-margin", "-3", "--out", str(tmp_path / "o")]) == 2
    assert "--sm-margin" in capsys.readouterr().err


def test_max_steps_defaults_and_bounds(tmp_path, monkeypatch):
    from moe_overlap.verify.plan import build as plan_mod

    monkeypatch.setattr(plan_mod, "cuda_device_count", lambda: 2)
    gpu = make_plan(VerifyOptions(out=tmp_path / "g", device="cuda", steps=12))
    assert gpu.max_steps == 60 and worker_options(gpu)[-2:] == ["--max-steps", "60"]
    assert make_plan(VerifyOptions(out=tmp_path / "g", device="cuda", steps=100)).max_steps == 300
    cpu = make_plan(VerifyOptions(out=tmp_path / "c", steps=12))
    assert cpu.max_steps == 12 and "--max-steps" not in worker_options(cpu)
    assert make_plan(VerifyOptions(out=tmp_path / "c", steps=4, max_steps=9)).max_steps == 9
    with pytest.raises(VerifyInputError) as err:
        make_plan(VerifyOptions(out=tmp_path / "c", steps=8, max_steps=4))
    assert err.value.field == "max_steps"


def test_every_rank_decides_alike_when_throughput_is_settled():
    from types import SimpleNamespace

    from moe_overlap.verify.run.worker import throughput_settled

    def runner(name, times):
        return SimpleNamespace(spec=SimpleNamespace(name=name), step_times=list(times))

    base = runner("baseline", [2.0] + [1.0, 1.01, 0.99, 1.0, 1.02, 0.98])
    clear = runner("overlap", [2.0] + [0.8, 0.81, 0.79, 0.8, 0.82, 0.78])  # 25% faster: pass
    wobbly = runner("overlap+wgrad", [2.0, 0.7, 1.3, 0.98, 1.4, 0.6, 1.0])  # straddles the line
    assert throughput_settled([base, clear], "cuda")
    assert not throughput_settled([base, clear, wobbly], "cuda")
    assert throughput_settled([clear], "cuda")  # no baseline: nothing to settle
