"""One rank of a verification run: ``python -m moe_overlap.verify.run.worker --config CFG.json --out DIR ...``.

Reads the standard torch.distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK),
so the same command runs under ``torchrun`` or Slurm unchanged. Writes:
  <out>/ranks/rank<R>.jsonl    records (every record is a heartbeat the launcher's watchdog waits for)
  <out>/ranks/rank<R>.stacks   Python stacks of all threads, dumped on SIGUSR1 (the launcher's hang probe)
  <out>/logs/<mode>/rank<R>.log  the training log of each mode (effective config + one line per step)
Exit status: 0 done, 1 a mode raised (traceback recorded), 3 the launcher went away.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from moe_overlap.verify.run.records import RecordWriter, mode_log_path, records_path, stacks_path

PARENT_ENV = "MOE_OVERLAP_VERIFY_PARENT_PID"


def _watch_parent(parent_pid: int) -> None:
    """Exit when the launcher is gone: a rank must never outlive it (even if the launcher was SIGKILLed)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(0.5)


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise SystemExit(f"worker: environment variable {name} is not set (run under torchrun or the launcher)")
        return default
    return int(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m moe_overlap.verify.run.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="VerifyConfig as JSON (file path)")
    ap.add_argument("--modes", required=True, help="JSON list of mode specs, or a comma list of mode names")
    ap.add_argument("--out", required=True, help="output folder shared by all ranks")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--fabric", default="native", help="the NCCL fabric the launcher set up (recorded in the report)")
    ap.add_argument("--a2a", choices=["nccl", "ce", "auto"], default=None,
                    help="all-to-all transport (ep/transport.py); default: the process group's own")
    ap.add_argument("--sm-margin", default="auto", help="SMs the 1f1b expert GEMMs leave to the all-to-all "
                    "kernels (ep/sm_margin.py): auto or an int")
    ap.add_argument("--graphs", choices=["auto", "off"], default="auto",
                    help="replay the experts nodes from CUDA graphs where they apply (ep/node_graphs.py): auto = on "
                         "CUDA (EP 1, or EP > 1 with --sync-free; not with delayed wgrad), off on CPU")
    ap.add_argument("--sync-free", action="store_true",
                    help="the host-sync-free EP path (ep/sync_free.py: device counts, equal-block NCCL all-to-alls)")
    ap.add_argument("--no-explain", action="store_true", help="skip timing the step's pieces alone after training")
    ap.add_argument("--step-budget-s", type=float, default=None,
                    help="stop extending once the modes' step times add up to this (the launcher's timeout share)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="keep stepping past the config's steps, up to this many, until the throughput judgement "
                         "is settled (every overlap mode pass or fail)")
    ap.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _mode_specs(text: str, cfg):
    from moe_overlap.verify.plan.modes import ModeSpec, resolve_modes

    if text.lstrip().startswith("["):
        return [ModeSpec(**d) for d in json.loads(text)]
    specs, _ = resolve_modes(cfg, [m.strip() for m in text.split(",") if m.strip()], None)
    return specs


def _within_budget(runners, budget_s: float | None) -> bool:
    """The step times so far (identical on every rank) leave room for another round of steps."""
    if budget_s is None:
        return True
    spent = sum(sum(r.step_times) for r in runners)
    last_round = sum(r.step_times[-1] for r in runners if r.step_times)
    return spent + last_round <= budget_s


def throughput_settled(runners, device: str) -> bool:
    """Whether every overlap mode's throughput outcome against the baseline is pass or fail (throughput.py).

    Computed from the slowest rank's step times, which every rank holds identically: all ranks decide alike
    without a collective."""
    from moe_overlap.verify.judge.throughput import TOLERANCE, compare

    base = next((r for r in runners if r.spec.name == "baseline"), None)
    if base is None:
        return True
    tolerance = TOLERANCE.get(device, TOLERANCE["cuda"])
    return all(compare(base.step_times, r.step_times, tolerance)["outcome"] in ("pass", "fail")
               for r in runners if r is not base)


def _comm_setup(cfg, args, group, device, world: int):
    """The host group for token counts (world > 1), the all-to-all transport every mode uses, a note on it,
    and the SM margin of the 1f1b expert GEMMs with its reason (ep/sm_margin.py)."""
    counts_group, transport, note = _transport_setup(cfg, args, group, device, world)
    from moe_overlap.ep.sm_margin import resolve_margin

    requested = args.sm_margin if args.sm_margin == "auto" else int(args.sm_margin)
    network = args.fabric != "native"
    if not network and transport is None and device.type == "cuda" and world > 1:  # same branch on every rank
        from moe_overlap.ep.transport import host_count

        network = host_count(group) > 1
    margin, why = resolve_margin(requested, device=device, nccl_all_to_all=transport is None, network=network,
                                 world=world)
    return counts_group, transport, note, margin, why


def graphs_setting(args, device) -> tuple[bool, str]:
    """(graphs on, the report's line): where they apply each mode says in its notes (ep/node_graphs.py)."""
    if args.graphs == "off":
        return False, "off (asked)"
    if device.type != "cuda":
        return False, "off (CPU ranks: CUDA graphs need a CUDA device)"
    return True, ("on: the experts nodes replayed from CUDA graphs where they apply (EP 1"
                  + (", the sync-free EP path" if args.sync_free else "; at EP > 1 only with --sync-free")
                  + "; not with delayed wgrad)")


def _transport_setup(cfg, args, group, device, world: int):
    import torch
    import torch.distributed as dist

    counts_group = dist.new_group(backend="gloo") if world > 1 else None
    if args.sync_free:  # device counts, equal-block all-to-alls of the process group (host splits nowhere)
        if args.a2a == "ce":
            raise SystemExit("worker: --sync-free takes the process group's all-to-all; drop --a2a ce")
        return None, None, ("nccl" if device.type == "cuda" else "gloo") + " (sync-free: equal-block all-to-alls)"
    kind = args.a2a
    if device.type != "cuda":  # what ran is recorded: gloo's own all-to-all (the plan refuses nccl/ce on CPU)
        return counts_group, None, "gloo (CPU ranks: the process group's own)"
    if kind is None:
        # Default on CUDA: copy engines when every rank is on this host with peer access (on NVLink an
        # SM-driven NCCL all-to-all hides almost nothing behind the GEMMs; docs/benchmarks.md), NCCL
        # otherwise; the emulated inter-node fabric is there to run NCCL's network transport.
        if device.type != "cuda" or world == 1 or args.fabric != "native":
            return counts_group, None, ("nccl" if device.type == "cuda" else "gloo") + " (the process group's own)"
        kind = "auto"
    args.a2a = kind
    from moe_overlap.ep.transport import make_transport
    from moe_overlap.verify.run.train import DTYPES

    esize = torch.empty((), dtype=DTYPES[cfg.precision]).element_size()
    # The largest all-to-all one rank sends: every routed row of a micro-batch (T * K rows of D elements).
    transport, reason = make_transport(args.a2a, group, device,
                                       max_rows=cfg.micro_batch_size * cfg.seq_length * cfg.moe_router_topk,
                                       max_row_bytes=cfg.hidden_size * esize)
    return counts_group, transport, f"{kind}: {reason}"


def _explain(runners, cfg, rank: int, group, device, counts_group, transport, rec) -> None:
    """Time one step's pieces alone with the baseline's model (or the first mode's), record them on rank 0."""
    from moe_overlap.ep.streams import make_comm_stream
    from moe_overlap.verify.calibrate.pieces import measure_pieces
    from moe_overlap.verify.run.train import make_batches

    runner = next((r for r in runners if r.spec.name == "baseline"), runners[0])
    pieces = measure_pieces(runner.model, make_batches(cfg, 0, rank, device), group, device,
                            counts_group=counts_group, transport=transport, comm_stream=make_comm_stream(device))
    if rank == 0:
        rec.emit("pieces", model_of=runner.spec.name, **pieces)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", rank)
    out = Path(args.out)
    rec = RecordWriter(records_path(out, rank))
    rec.emit("hello", rank=rank, world=world, local_rank=local_rank, host=os.uname().nodename)
    stacks = open(stacks_path(out, rank), "x", encoding="utf-8")  # noqa: SIM115 - held for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    if os.environ.get(PARENT_ENV):
        threading.Thread(target=_watch_parent, args=(int(os.environ[PARENT_ENV]),), daemon=True).start()

    from moe_overlap.verify.plan.config import VerifyConfig

    cfg = VerifyConfig.model_validate_json(Path(args.config).read_text(encoding="utf-8"))
    specs = _mode_specs(args.modes, cfg)
    mode, code = None, 0
    try:
        import torch
        import torch.distributed as dist

        from moe_overlap.verify.run.train import ModeRunner

        torch.set_num_threads(int(os.environ.get("MOE_OVERLAP_THREADS", "1")))
        if args.device == "cuda":
            torch.cuda.set_device(local_rank)
            device, backend = torch.device("cuda", local_rank), "nccl"
        else:
            device, backend = torch.device("cpu"), "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                **({"device_id": device} if backend == "nccl" else {}))
        group = dist.group.WORLD
        counts_group, transport, transport_note, margin, margin_note = _comm_setup(cfg, args, group, device, world)
        from moe_overlap.verify.run.baseline_transport import baseline_setup

        base_transport, transport, transport_note, base_note, a2a_ms = baseline_setup(
            cfg, args.a2a, args.sync_free, group, device, world, counts_group, transport, transport_note)
        graphs_on, graphs_note = graphs_setting(args, device)
        rec.emit("init", backend=backend, device=str(device), torch=torch.__version__, fabric=args.fabric,
                 a2a=args.a2a, transport=transport_note, baseline_transport=base_note, a2a_alone_ms=a2a_ms,
                 counts_group="gloo" if counts_group is not None else None,
                 sm_margin=margin_note, graphs=graphs_note, sync_free=args.sync_free)
        logs = {}
        for spec in specs:
            path = mode_log_path(out, spec.name, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            logs[spec.name] = open(path, "x", encoding="utf-8")  # noqa: SIM115 - closed below

        def logger(name: str):
            def log(line: str) -> None:
                logs[name].write(line + "\n")
                logs[name].flush()
            return log

        try:
            runners = []
            for spec in specs:
                mode = spec.name
                runners.append(ModeRunner(cfg, spec, group, device, rec.emit, logger(spec.name),
                                          fault=args.inject_fault, counts_group=counts_group,
                                          transport=transport if spec.overlap else base_transport,
                                          sm_margin=margin, graphs=graphs_on,
                                          sync_free=args.sync_free))
            # Round-robin over the modes, one step each (see ModeRunner: fair throughput comparison); past
            # cfg.steps only while the throughput judgement is not settled (every rank decides alike).
            max_steps = max(cfg.steps, args.max_steps or cfg.steps)
            step = 0
            while step < cfg.steps or (step < max_steps and _within_budget(runners, args.step_budget_s)
                                       and not throughput_settled(runners, args.device)):
                for runner in runners:
                    mode = runner.spec.name
                    runner.step(step)
                step += 1
            mode = None
            for runner in runners:
                runner.finish()
            if max_steps > cfg.steps and rank == 0:
                settled = throughput_settled(runners, args.device)
                rec.emit("steps_extended", planned=cfg.steps, ran=step, max_steps=max_steps, settled=settled,
                         stopped_by="settled" if settled else "max-steps" if step >= max_steps else "time budget")
            if not args.no_explain:
                _explain(runners, cfg, rank, group, device, counts_group, transport, rec)
        except BaseException:
            if mode is not None:  # the traceback goes to the mode's training log, where check-logs finds it
                logger(mode)(traceback.format_exc().rstrip())
            raise
        finally:
            for f in logs.values():
                f.close()
        dist.barrier(group)
        dist.destroy_process_group()
        rec.emit("done")
    except Exception:
        rec.emit("error", mode=mode, traceback=traceback.format_exc())
        traceback.print_exc()
        code = 1
    finally:
        rec.close()
    if code:
        # Skip interpreter shutdown: tearing down a process group whose peers are blocked can hang,
        # and the launcher must see this rank exit now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
