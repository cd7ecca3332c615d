"""`moe-overlap diagnose "TEXT"`: rank known failure modes against an error message or symptom.

Exit 0 when a failure mode scores at or above the calibrated threshold, 1 when the text is not an EP-overlap
failure (the result says what it looks like and what to do instead), 2 on bad input.
"""

from __future__ import annotations

from moe_overlap.commands._common import EXIT_FAIL, EXIT_OK, CommandError, add_format_argument, emit


def add_arguments(parser) -> None:
    parser.add_argument("text", help="error message, log excerpt or symptom (quote it)")
    parser.add_argument("--limit", type=int, default=5, help="at most this many failure modes (default 5)")
    parser.add_argument("--skill", default="perf-expert-parallel-overlap", help="skill whose card to use")
    add_format_argument(parser)


def render_text(result) -> str:
    if not result.matches:
        query = result.query if len(result.query) <= 200 else result.query[:200] + "..."
        kind = result.not_ep_overlap.kind if result.not_ep_overlap else "unrecognised"
        return f"not an EP-overlap failure ({kind}): {query!r}\nhint: {result.hint}"
    lines = []
    for i, m in enumerate(result.matches, 1):
        lines += [
            f"{i}. {m.failure_mode}  (score {m.score:.2f}; rules: {', '.join(m.rule_ids) or '-'})",
            f"   symptom:        {m.symptom}",
            f"   likely cause:   {m.likely_cause}",
            f"   how to confirm: {m.how_to_confirm}",
            f"   fix:            {m.fix}",
            *([f"   sources:        {'; '.join(m.sources)}"] if m.sources else []),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def run(args) -> int:
    from moe_overlap.skill.card.cards import CardError
    from moe_overlap.skill.diagnose.api import diagnose

    try:
        result = diagnose(args.text, limit=args.limit, skill=args.skill)
    except ValueError as exc:
        raise CommandError(str(exc), field="text", fix='moe-overlap diagnose "AssertionError: ..."') from None
    except CardError as exc:
        raise CommandError(exc.message, field="skill", choices=exc.choices) from None
    emit(result, args.format, render_text(result))
    return EXIT_OK if result.matches else EXIT_FAIL
