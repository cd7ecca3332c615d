"""generate_config: `api.py` is the entry point (a request -> validated stage configs, or a refusal with the
nearest working request), `model.py` the request and result models, `resolve.py` turns a request into one
consistent set of choices (adjustments and refusals), `upstream.py` fills what the request leaves open from
Megatron-Bridge's recipe for the model, GPU and scale, `pipeline.py` chooses the virtual pipeline and layout,
`stages.py` builds each rollout stage and its checks, and `render.py` writes a config in the formats users paste.
The model shapes and recipes are moe_overlap.skill.models. Every stage is checked with rules/validate before it
is returned, and carries the notes that apply to it (rules/notes.py).

May import: moe_overlap.skill.config, moe_overlap.skill.rules, moe_overlap.skill.models
"""
