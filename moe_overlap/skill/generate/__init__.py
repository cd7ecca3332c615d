"""generate_config: `api.py` is the entry point (a request -> validated stage configs, or a refusal with the
nearest working request), `model.py` the request and result models, `resolve.py` turns a request into one
consistent set of choices (adjustments and refusals), `stages.py` builds each rollout stage and its checks,
`presets.py` holds the public models' MoE dimensions, and `render.py` writes a config in the formats users paste.
Every stage is checked with rules/validate before it is returned.

May import: moe_overlap.skill.config, moe_overlap.skill.rules
"""
