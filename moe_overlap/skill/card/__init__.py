"""The skill card: `cards.py` lists skills and loads `card.yaml` and the evals, `model.py` and `evals.py` are their
pydantic models (the JSON Schemas under schemas/ are generated from them), `docfile.py` reads a YAML/JSON data file
and reports problems as file:line plus JSON path, and `schemas.py` maps each schema file to its model by dotted
name (resolved on demand, so it imports none of the models it names). It owns the card's shape and loading, not
what the card's rules mean (rules/) or how failures are matched (diagnose/).

May import: moe_overlap.paths
"""
