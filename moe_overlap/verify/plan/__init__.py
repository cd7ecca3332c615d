"""Planning a verification: the options, the run config, the modes, the plan, its file and the output folder.

options.py (VerifyOptions: what a caller asks for), config.py (the run's model, VerifyConfig, read and mapped
once from a source; a Megatron source parsed once into the skill's OverlapConfig on the way), modes.py
(baseline / overlap / overlap+wgrad as ModeSpec), build.py (make_plan: ranks, device, modes; validate_modes:
every overlap mode validated from the one parse), plan_file.py (the plan saved beside the report),
outdir.py (a run owns its output folder). Torch-free.

May import: moe_overlap.skill.config, moe_overlap.skill.rules, moe_overlap.verify.run.corpus
"""
