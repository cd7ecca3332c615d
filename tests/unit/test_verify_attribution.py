"""The rank that failed first is the one named (issue 15), whatever the order its peers' errors arrived in;
and bad verify inputs (config values, a judged folder's plan.json) are clear errors, quickly."""

from __future__ import annotations

import json
import time

import pytest

from moe_overlap.verify.judge.attribution import RankEnd, describe, first_failure, is_peer_error

PEER_TB = ("Traceback (most recent call last):\n  File \"train.py\", line 1, in step\n"
           "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
           "[127.0.0.1]:29500\n")
OWN_TB = "Traceback (most recent call last):\n  File \"train.py\", line 9\nmoe_overlap.verify.run.train.InjectedFault: x\n"


def test_a_rank_killed_by_a_signal_is_named_before_the_peer_that_logged_an_error_first():
    ends = [RankEnd(rank=0, pid=10, state="exited", exit_code=1, seen_at=5.2, error_at=5.0,
                    peer_error=is_peer_error(PEER_TB)),
            RankEnd(rank=1, pid=11, state="killed", exit_code=-9, signal="SIGKILL", seen_at=5.1)]
    first = first_failure(ends)
    assert first.rank == 1 and "killed by SIGKILL" in describe(first)


@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_kill_of_rank_r_names_rank_r_whatever_the_timing(victim):
    ends = [RankEnd(rank=r, pid=100 + r, state="exited", exit_code=1, seen_at=9.0 - r, error_at=1.0 + r / 10,
                    peer_error=True) for r in range(4)]
    ends[victim] = RankEnd(rank=victim, pid=100 + victim, state="killed", exit_code=-9, signal="SIGKILL",
                           seen_at=20.0)
    assert first_failure(ends).rank == victim


@pytest.mark.parametrize("victim", [0, 1])
def test_a_stopped_rank_is_named(victim):
    ends = [RankEnd(rank=r, pid=100 + r, state="running") for r in range(2)]
    ends[victim].state = "stopped"
    first = first_failure(ends)
    assert first.rank == victim and "stopped" in describe(first)


def test_an_own_exception_beats_peer_errors_and_the_earliest_own_one_wins():
    ends = [RankEnd(rank=0, pid=1, state="exited", exit_code=1, error_at=3.0, peer_error=is_peer_error(PEER_TB)),
            RankEnd(rank=1, pid=2, state="exited", exit_code=1, error_at=4.0, peer_error=is_peer_error(OWN_TB)),
            RankEnd(rank=2, pid=3, state="exited", exit_code=1, error_at=4.5, peer_error=False)]
    assert first_failure(ends).rank == 1


def test_only_peer_errors_the_earliest_is_named():
    ends = [RankEnd(rank=0, pid=1, state="exited", exit_code=1, error_at=3.0, peer_error=True),
            RankEnd(rank=1, pid=2, state="exited", exit_code=1, error_at=2.0, peer_error=True)]
    assert first_failure(ends).rank == 1
    assert first_failure([RankEnd(rank=0, pid=1, state="exited", exit_code=0)]) is None


def _judge_folder(tmp_path, plan, config=None):
    from moe_overlap.verify.plan.outdir import MARKER

    (tmp_path / MARKER).write_text("{}")
    (tmp_path / "plan.json").write_text(plan if isinstance(plan, str) else json.dumps(plan))
    (tmp_path / "config.json").write_text(json.dumps(config if config is not None else {"format": "moe-overlap"}))
    return tmp_path


GOOD_PLAN = {"config_source": "embedded default", "config_kind": "default", "nproc": 2, "device": "cpu",
             "specs": [{"name": "baseline", "schedule": "none", "delay_wgrad": False}]}


@pytest.mark.parametrize("plan,words", [
    ({}, "config_source"), ({**GOOD_PLAN, "nproc": 1e9}, "nproc"), ({**GOOD_PLAN, "nproc": 10**12}, "nproc"),
    ({**GOOD_PLAN, "nproc": "two"}, "nproc"), ({**GOOD_PLAN, "specs": []}, "specs"), ([], "top level"),
    ("{", "not valid JSON"), ("9" * 5000, "5000 digits"), ("[" * 5000, "nested deeper"),
    ({**GOOD_PLAN, "config_kind": "x"}, "config_kind"), ({**GOOD_PLAN, "device": "tpu"}, "device"),
])
def test_a_bad_plan_json_is_a_clear_error_quickly(tmp_path, plan, words):
    from moe_overlap.cli import main
    from moe_overlap.verify.judge.offline import judge_run_dir
    from moe_overlap.verify.plan.build import VerifyInputError

    _judge_folder(tmp_path, plan)
    t0 = time.monotonic()
    with pytest.raises(VerifyInputError) as err:
        judge_run_dir(tmp_path)
    assert time.monotonic() - t0 < 2 and words in err.value.message and err.value.field == "judge"
    assert main(["verify", "--judge", str(tmp_path)]) == 2


def test_judging_a_folder_that_is_not_ours_is_refused(tmp_path):
    from moe_overlap.verify.judge.offline import judge_run_dir
    from moe_overlap.verify.plan.build import VerifyInputError

    (tmp_path / "plan.json").write_text(json.dumps(GOOD_PLAN))
    with pytest.raises(VerifyInputError, match="not a run folder"):
        judge_run_dir(tmp_path)


@pytest.mark.parametrize("value", ["abc", [1, 2], {"a": 1}, 2.5, "9" * 5000, None])
def test_a_verify_config_with_a_bad_topk_is_a_clear_error(tmp_path, value):
    from moe_overlap.verify.plan.config import VerifyConfigError, load_verify_config

    for data in ({"model": {"num_moe_experts": 4, "moe_router_topk": value}},
                 {"format": "moe-overlap", "moe_router_topk": value}):
        if value is None and "model" in data:
            load_verify_config(data)  # a Megatron null: unset, the default
            continue
        with pytest.raises(VerifyConfigError) as err:
            load_verify_config(data)
        assert "moe_router_topk" in err.value.message and len(err.value.message) < 300
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(data))
        with pytest.raises(VerifyConfigError):
            load_verify_config(str(path))
