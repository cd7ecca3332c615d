"""The rule set: every rule table, in card order, and the rules of one Megatron-Core release line.

Kept apart from base.py (the types the tables import) so the tables and the registry never import each other.
"""

from __future__ import annotations

from moe_overlap.skill.rules.base import Release, Rule
from moe_overlap.skill.rules.flex import RULES as FLEX
from moe_overlap.skill.rules.overlap import RULES as OVERLAP
from moe_overlap.skill.rules.wgrad import RULES as WGRAD


def all_rules() -> tuple[Rule, ...]:
    """Every rule of every family, in card order."""
    return OVERLAP + WGRAD + FLEX


def rules_for(line: Release) -> tuple[Rule, ...]:
    return tuple(r for r in all_rules() if r.applies_to(line))
