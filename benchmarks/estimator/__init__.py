"""The estimator against measured times: the public anchors and our own GPU runs (estimate_anchors), and our
layer on CPU gloo ranks (estimate_vs_measured)."""
