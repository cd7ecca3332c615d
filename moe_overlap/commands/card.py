"""`moe-overlap card [NAME] [--section S] [--field dotted.path]`: list the skills, a card's overview, or a part.

NAME may be left out with --section/--field when one skill is installed (`moe-overlap card --field summary`).

`--format json` prints what the MCP tools return: the skill list (`list_skills`), or a card read
(`get_skill_card`): the contents without --section/--field, else the part asked for. Exit 0 on success, 2
on an unknown skill, section or field (the valid choices are listed) or a malformed card (every problem
with file, line and JSON path).
"""

from __future__ import annotations

from typing import Any

from moe_overlap.commands._common import EXIT_OK, CommandError, add_format_argument, emit


def add_arguments(parser) -> None:
    parser.add_argument("name", nargs="?", help=(
        "skill name (omit to list the skills; with --section/--field it defaults to the only skill)"))
    parser.add_argument("--section", metavar="NAME",
                        help="one top-level section of the card, e.g. constraints (--field is then inside it)")
    parser.add_argument("--field", metavar="PATH",
                        help="dotted path into the card, e.g. summary, constraints.ep-size-gt-1.requires, "
                             "failure_modes.0 (list entries by index or by their id/name)")
    add_format_argument(parser, choices=("text", "json", "yaml"))


def _text(value: Any) -> str | None:
    """Scalars print bare (scripts can use `$(moe-overlap card NAME --field summary)`); the rest as YAML."""
    if value is None:
        return ""
    if isinstance(value, str | int | float | bool):
        return str(value)
    return None


def _card_overview(card) -> str:
    lines = [f"{card.name}: {card.title}", "", card.summary, "",
             f"validation: {card.validation_status.level} - {card.validation_status.detail}", "",
             "constraints:"]
    width = max(len(c.id) for c in card.constraints)
    lines += [f"  {c.id:<{width}}  {c.severity:<7}  {c.requires}" for c in card.constraints]
    lines += ["", "failure modes: " + ", ".join(f.name for f in card.failure_modes), "",
              f"more: moe-overlap card {card.name} --section <name> | --field <path>   "
              f"(fields: {', '.join(type(card).model_fields)})"]
    return "\n".join(lines)


def _list_text(skills) -> str:
    if not skills:
        return "no skills installed"
    return "\n".join(f"{s.name}  [{s.validation_status}]\n  {s.summary}" for s in skills)


def _only_skill() -> str:
    """The skill --section/--field read when no NAME is given: the only one installed, else a usage error."""
    from moe_overlap.skill.card.cards import skill_names

    names = skill_names()
    if len(names) == 1:
        return names[0]
    raise CommandError(f"--section and --field need a skill name: {len(names)} skills are installed",
                       field="name", choices=names)


def run(args) -> int:
    from moe_overlap.skill.card.cards import CardError, CardFileError, load_card
    from moe_overlap.skill.card.contents import read_card, skill_list

    try:
        if args.name is None and (args.field or args.section):
            args.name = _only_skill()
        if args.name is None:
            skills = skill_list()
            emit(skills, args.format, _list_text(skills.skills))
            return EXIT_OK
        read = read_card(args.name, args.section, args.field, surface="cli")
        if read.contents is not None:
            if args.format == "json":
                emit(read, "json")
            else:  # people: the overview, or the whole card as YAML
                card = load_card(args.name)
                emit(card, args.format, _card_overview(card))
            return EXIT_OK
    except CardFileError as exc:
        raise CommandError(str(exc), fix="fix the card file at the lines listed") from None
    except CardError as exc:
        field = ("name" if exc.message.startswith("unknown skill") else
                 "section" if exc.message.startswith("unknown section") else "field")
        raise CommandError(exc.message, field=field, choices=exc.choices) from None
    if args.format == "json":
        emit(read, "json")
    else:  # people and shell scripts get the value itself: `$(moe-overlap card NAME --field summary)`
        emit(read.value, args.format, _text(read.value))
    return EXIT_OK
