"""`moe-overlap verify [CONFIG]`: A/B verification runs of the included MoE implementation, judged by the
seed's four success criteria (exit 0 passed or throughput-not-judged / 1 any other verdict / 2 bad input,
nothing launched). `--format json` prints the outcome: verify/judge/summary.py's summary, the failure, the path of
report.json (every step, each criterion's evidence)."""

from __future__ import annotations

import argparse
import sys

from moe_overlap.commands._common import EXIT_FAIL, EXIT_OK, CommandError, add_format_argument, emit


def add_arguments(parser) -> None:
    parser.add_argument("config", nargs="?", help="moe-overlap or Megatron-Bridge-style config (YAML/JSON); "
                        "default: the embedded small MoE LM on 2 CPU ranks")
    parser.add_argument("--nproc", type=int, help="ranks (default: the config's expert_model_parallel_size)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu: gloo ranks; cuda: NCCL, one GPU per rank")
    parser.add_argument("--steps", type=int, help="optimizer steps per mode (first one is warm-up)")
    parser.add_argument("--max-steps", type=int,
                        help="cuda: keep stepping past --steps, up to this many, until the throughput judgement is "
                             "settled (default 5 x steps, at most steps + 200; cpu: --steps)")
    parser.add_argument("--micro-batches", type=int, help="micro-batches per step (1f1b needs >= 2)")
    parser.add_argument("--modes", help="comma list of baseline,overlap,overlap+wgrad (default: all that apply)")
    parser.add_argument("--schedule", choices=["chunked", "1f1b"], help="the overlap schedule (default 1f1b)")
    parser.add_argument("--fabric", choices=["native", "emulated-net"], default="native",
                        help="NCCL fabric of every rank (cuda): native, or emulated-net (NCCL's network transport "
                             "on this host: all-to-alls behave like an inter-node link)")
    parser.add_argument("--a2a", choices=["nccl", "ce", "auto"],
                        help="all-to-all transport (cuda): nccl, ce (copy engines, one host), auto "
                             "(default: auto on cuda with the native fabric, else the process group's own)")
    parser.add_argument("--sm-margin", default="auto",
                        help="cuda, 1f1b: SMs the expert GEMMs leave to the all-to-all kernels beside them; auto "
                             "(default): 8 for NCCL over a network link (several hosts, --fabric emulated-net), else 0")
    parser.add_argument("--no-explain", action="store_true",
                        help="skip timing the step's all-to-alls and expert GEMMs alone after training")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit in seconds (default 600)")
    parser.add_argument("--hang-timeout", type=float, default=60.0,
                        help="a rank without heartbeat this long is a hang (default 60)")
    parser.add_argument("--out", help="output folder (default: ./verify-out/<time>-<pid>-<id>)")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that already holds a report")
    parser.add_argument("--launcher", choices=["local", "slurm"], default="local",
                        help="local (default): ranks on this machine; slurm: submit the sbatch script (as "
                             "--print-launch slurm prints it), track the job, judge its folder, scancel on Ctrl-C")
    parser.add_argument("--nodes", type=int, help="slurm / --print-launch: nodes (default: nproc / gpus-per-node)")
    parser.add_argument("--gpus-per-node", type=int,
                        help="slurm / --print-launch: ranks per node (default 8 on cuda; cpu: nproc / nodes)")
    parser.add_argument("--partition", help="slurm: the partition (#SBATCH --partition)")
    parser.add_argument("--account", help="slurm: the account (#SBATCH --account)")
    parser.add_argument("--time", dest="time_limit", help="slurm: the job's time limit, e.g. 00:30:00 "
                        "(default: --timeout)")
    parser.add_argument("--print-launch", choices=["torchrun", "slurm"],
                        help="print the torchrun command or an sbatch script instead of running")
    parser.add_argument("--judge", metavar="DIR", help="judge a run launched elsewhere (torchrun/slurm) from the "
                        "records in DIR (written by --print-launch) and write its report")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--inject-fault", help=argparse.SUPPRESS)  # test-only
    add_format_argument(parser)


def _options(args):
    from pydantic import ValidationError

    from moe_overlap.verify.plan.options import VerifyOptions

    margin = args.sm_margin
    if margin != "auto":
        try:
            margin = int(margin)
        except ValueError:
            raise CommandError(f"--sm-margin {margin!r}: give auto or an int >= 0 (SMs the expert GEMMs leave to "
                               "the all-to-all kernels)", field="sm_margin") from None
    try:
        return VerifyOptions(
            config=args.config, nproc=args.nproc, device=args.device, steps=args.steps, max_steps=args.max_steps,
            micro_batches=args.micro_batches, schedule=args.schedule, timeout_s=args.timeout,
            hang_timeout_s=args.hang_timeout, out=args.out, fabric=args.fabric, a2a=args.a2a,
            sm_margin=margin, explain=not args.no_explain, force=args.force, inject_fault=args.inject_fault,
            launcher=args.launcher, nodes=args.nodes, gpus_per_node=args.gpus_per_node, partition=args.partition,
            account=args.account, time_limit=args.time_limit,
            modes=[m.strip() for m in args.modes.split(",") if m.strip()] if args.modes is not None else None)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        flag = "--" + field.replace("_s", "").replace("_limit", "").replace("_", "-") if field else None
        raise CommandError(f"{flag or 'option'}: {err['msg']}", field=field) from None


def _progress_printer(quiet: bool):
    def show(ev: dict) -> None:
        if quiet:
            return
        e = ev.get("event")
        t = f"[{ev['elapsed_s']:6.1f}s]"
        if e == "start":
            msg = f"verify: {ev['nproc']} rank(s), modes {', '.join(ev['modes'])} -> {ev['out']}"
        elif e == "mode":
            msg = f"mode {ev['mode']} (schedule {ev['schedule']})"
        elif e == "step":
            msg = f"  {ev['mode']} step {ev['step']}/{ev['steps']} loss {ev['loss']:.4f}"
        elif e == "slurm":
            why = f" ({ev['reason']})" if ev.get("reason") not in (None, "None") else ""
            nodes = f" on {','.join(ev['nodes'])}" if ev.get("nodes") else ""
            msg = f"Slurm job {ev['job_id']}: {ev['state']}{why}{nodes}"
            msg += f" exit {ev['exit_code']}" if ev.get("exit_code") and ev["state"] not in ("RUNNING", "PENDING") else ""
        elif e == "done":
            msg = f"verdict: {ev['verdict']}"
        else:
            return
        print(f"{t} {msg}", file=sys.stderr, flush=True)
    return show


def _text(report) -> str:
    from moe_overlap.verify.judge.summary import render_summary, verification_summary

    lines = render_summary(verification_summary(report)).splitlines()
    if report.cluster_job is not None:
        job = report.cluster_job
        at = len(lines) - 1 if lines[-1].startswith("report:") else len(lines)
        lines.insert(at, f"  Slurm job {job.job_id}: {job.state} on {','.join(job.nodes or ['?'])}, exit "
                         f"{job.exit_code} (script {job.script})")
    if report.failure is not None:
        at = len(lines) - 1 if lines[-1].startswith("report:") else len(lines)
        extra = [f"  failure: {report.failure.message}"]
        if report.failure.traceback:
            extra.append("  " + report.failure.traceback.strip().splitlines()[-1])
        lines[at:at] = extra
    return "\n".join(lines)


def run(args) -> int:
    from moe_overlap.verify.api import run_verification
    from moe_overlap.verify.plan.build import VerifyInputError, make_plan
    from moe_overlap.verify.rundir.read import RunFolderError

    if args.judge is not None and not args.judge.strip():
        raise CommandError("--judge '': an empty folder name", field="judge",
                           fix="give the run folder to judge: --judge DIR (the --out of --print-launch)")
    if args.out is not None and not args.out.strip():
        raise CommandError("--out '': an empty folder name", field="out", fix="give a folder: --out DIR")
    options = _options(args)
    cluster = [f for f, v in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node),
                              ("--partition", args.partition), ("--account", args.account),
                              ("--time", args.time_limit)) if v is not None]
    if cluster and args.launcher == "local" and not args.print_launch:
        raise CommandError(f"{', '.join(cluster)}: only with --launcher slurm or --print-launch (a local run uses "
                           "this machine)", field="launcher")
    try:
        if args.print_launch:
            from moe_overlap.verify.judge.offline import write_plan
            from moe_overlap.verify.run.launch_print import cluster_shape, slurm_script, torchrun_command

            plan = make_plan(options, local=False)
            given = options.nodes is not None or options.gpus_per_node is not None
            # torchrun without --nodes/--gpus-per-node: one agent for all ranks (what it printed before)
            nodes, per_node = (cluster_shape(plan, options.nodes, options.gpus_per_node)
                               if given or args.print_launch == "slurm" else (1, plan.nproc))
            write_plan(plan)
            text = (torchrun_command(plan, nnodes=nodes, nproc_per_node=per_node) if args.print_launch == "torchrun"
                    else slurm_script(plan, nodes=nodes, gpus_per_node=per_node, partition=options.partition,
                                      account=options.account, time_limit=options.time_limit,
                                      timeout_s=options.timeout_s))
            if args.format == "json":  # one JSON document, like every other --format json
                emit({"launch": args.print_launch, "out": str(plan.out),
                      "command" if args.print_launch == "torchrun" else "script": text,
                      "judge": f"moe-overlap verify --judge {plan.out}"}, "json")
            else:
                print(text)
            return EXIT_OK
        if args.judge is not None:
            from moe_overlap.verify.judge.offline import judge_run_dir

            report = judge_run_dir(args.judge)
        elif options.launcher == "slurm":
            from moe_overlap.verify.run.slurm_run import run_on_slurm

            report = run_on_slurm(options, progress=_progress_printer(args.quiet))
        else:
            report = run_verification(options, progress=_progress_printer(args.quiet))
    except VerifyInputError as exc:
        raise CommandError(exc.message, field=exc.field, fix=exc.fix) from None
    except RunFolderError as exc:  # a report file could not be written (the folder was changed under the run)
        raise CommandError(exc.message, field="out", fix=exc.fix, exit_code=EXIT_FAIL) from None
    if args.format == "json":  # the summary first and where the report is: what the MCP tools answer too
        from moe_overlap.verify.judge.outcome import outcome

        emit(outcome(report), "json")
    else:
        emit(report, args.format, _text(report))
    if report.verdict == "cancelled" and report.failure and "Ctrl-C" in report.failure.message:
        return 130
    # throughput-not-judged (CPU): every judged criterion passed; the verdict word says what was not judged.
    return EXIT_OK if report.verdict in ("passed", "throughput-not-judged") else EXIT_FAIL
