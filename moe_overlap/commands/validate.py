"""`moe-overlap validate CONFIG`: check an EP-overlap config against every constraint (exit 0 valid / 1 invalid / 2 bad input)."""

from __future__ import annotations

from moe_overlap.commands._common import EXIT_FAIL, EXIT_OK, CommandError, add_format_argument, emit


def add_arguments(parser) -> None:
    parser.add_argument("config", nargs="?", help="YAML or JSON config (Megatron-Bridge sections model:, "
                        "comm_overlap:, ddp:); optional when --argv is given")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted override, e.g. comm_overlap.delay_wgrad_compute=true (repeatable)")
    parser.add_argument("--argv", help='Megatron-LM flags, e.g. "--overlap-moe-expert-parallel-comm --bf16"')
    parser.add_argument("--torch-version", help="torch version to check against (default: installed)")
    parser.add_argument("--te-version", help="Transformer Engine version (default: installed)")
    parser.add_argument("--gpu", help="GPU name or compute capability, e.g. H100 or 9.0 (default: nvidia-smi)")
    parser.add_argument("--megatron-core-version", help=(
        "rule set to apply (default: a config implies Bridge 0.6.2's Core, 0.19; --argv alone: the installed "
        "megatron-core, else the newest known)"))
    add_format_argument(parser)


def run(args) -> int:
    from moe_overlap.skill.config.load import ConfigError
    from moe_overlap.skill.rules.validate import render_text, validate_config

    if args.config is None and not args.argv and not args.overrides:
        raise CommandError("no config given", fix="moe-overlap validate CONFIG.yaml, or --argv \"...\"")
    try:
        result = validate_config(args.config, overrides=args.overrides, argv=args.argv,
                                 torch_version=args.torch_version, te_version=args.te_version, gpu=args.gpu,
                                 megatron_core_version=args.megatron_core_version)
    except ConfigError as exc:
        raise CommandError(exc.message, field=exc.field, fix=exc.fix, choices=exc.choices) from None
    emit(result, args.format, render_text(result, args.config or "argv"))
    return EXIT_OK if result.valid else EXIT_FAIL
