"""Public MoE models shared by generate and estimate: `shapes.py` holds each model's shape under Megatron's field
names (GQA or MLA attention, dense and expert FFN sizes, first dense layers, shared experts, MTP) with the config
it comes from, `recipes.py` the parallel layouts, dispatchers and environments of Megatron-Bridge 0.6.2's recipes
for them (file and function), and `layout.py` the pipeline layout string for layer counts that do not split
evenly over the pipeline stages. Data and small pure functions only.

May import: nothing (a leaf: shapes and recipes are facts, not logic)
"""
