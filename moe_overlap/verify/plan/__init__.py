"""Planning a verification: the options, the run config, the modes, the plan, its file and the output folder.

options.py (VerifyOptions: what a caller asks for), config.py (the run's model, VerifyConfig, mapped from the
skill's parsed OverlapConfig), modes.py (baseline / overlap / overlap+wgrad as ModeSpec), build.py (make_plan:
ranks, device, validation of every mode), plan_file.py (the plan saved beside the report), outdir.py (a run owns
its output folder). Torch-free.

May import: moe_overlap.skill.config, moe_overlap.skill.rules, moe_overlap.verify.run.corpus
"""
