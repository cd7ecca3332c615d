"""The constraints as data and the validator: `base.py` (Rule, Ctx, Unchecked: what every rule table imports),
`overlap.py`, `wgrad.py`, `flex.py` (the rule tables, one per family), `registry.py` (the rule set of a
Megatron-Core release line), `versions.py` (version strings and release lines), `environment.py` (torch / TE / GPU
detected without importing them), `flex_backend.py` (Bridge's apply_flex_dispatcher_backend and backend support)
and `validate.py` (validate_parsed: run every rule on a parsed config, report findings; validate_config:
parse a source, then validate_parsed). Rule tables import base.py only;
registry.py imports the tables; in the package only validate.py imports registry.py.

May import: moe_overlap.skill.config
"""
