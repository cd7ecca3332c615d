"""After a run: `api.py` matches an error message or symptom to the card's failure modes (patterns, rule ids,
weighted shared words) and `logs.py` runs the seed's checks on a training log (check_training_log). Both only read:
the card is the one data source, the log is given as text.

May import: moe_overlap.skill.card, moe_overlap.skill.files
"""
