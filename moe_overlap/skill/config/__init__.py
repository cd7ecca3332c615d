"""A training config as the validator reads it: `load.py` turns a file or text into a dict (one ConfigError naming
the line or field for any bad input), `argv.py` maps Megatron-LM flags onto config sections and `megatron_lm.py`
applies Megatron-LM's own defaults and derivations (VPP, layer splits), `names.py` finds misspelt keys, and
`model.py` holds OverlapConfig (Megatron-Bridge ConfigContainer sections), `parse_config` (dict / path / YAML text
+ argv + dotted overrides -> OverlapConfig with info notes) and `effective_values` (Bridge's precedence applied, as
`bridge.py` reads Megatron-Bridge's CommOverlapConfig). It knows no rule and no run: it only parses.

May import: moe_overlap.skill.files
"""
