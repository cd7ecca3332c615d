"""--fabric and --a2a of a verification run: refused where they mean nothing, carried to every rank and into the
torchrun command, recorded in plan.json for --judge (torch-free)."""

from __future__ import annotations

import json

import pytest

from moe_overlap.ep.fabric import fabric_env
from moe_overlap.verify.api import options_command
from moe_overlap.verify.launch_print import rank_environment, torchrun_command, worker_options
from moe_overlap.verify.launcher import _rank_env
from moe_overlap.verify.offline import _load_plan
from moe_overlap.verify.options import VerifyOptions
from moe_overlap.verify.plan import VerifyInputError, make_plan
from moe_overlap.verify.plan_file import save_plan


@pytest.mark.parametrize("opts,field", [({"fabric": "emulated-net"}, "fabric"), ({"a2a": "ce"}, "a2a")])
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
    env = rank_environment(plan)
    assert env == fabric_env("emulated-net") and env["NCCL_P2P_DISABLE"] == "1"
    assert _rank_env(1, 2, 29500, 1, env)["NCCL_SHM_DISABLE"] == "1"
    cmd = torchrun_command(plan)
    assert cmd.startswith("NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=4") and " torchrun " in cmd
    assert cmd.endswith("--device cuda --fabric emulated-net --a2a ce --no-explain")
    (tmp_path / "o").mkdir()
    save_plan(plan)
    (tmp_path / "o" / "config.json").write_text(plan.cfg.model_dump_json())
    again = _load_plan(tmp_path / "o")
    assert (again.fabric, again.a2a, again.explain) == ("emulated-net", "ce", False)
    data = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert data["fabric"] == "emulated-net"


def test_command_line_names_the_options():
    cmd = options_command(VerifyOptions(device="cuda", fabric="emulated-net", a2a="auto", explain=False))
    assert cmd.endswith("--device cuda --fabric emulated-net --a2a auto --no-explain")
