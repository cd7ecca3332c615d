"""Run inside a child Python whose sys.path starts with one unpacked megatron-core release.

Reads a JSON list of cases from stdin, each {"kwargs": {...}, "torch": "2.6.0", "te": "2.12.0"} (and optionally
"cls": "MLATransformerConfig", for multi-latent attention), builds ``TransformerConfig(**kwargs)`` for each with Core's torch / TE version probes answering the case's versions,
and prints one JSON list of [accepted, exception type, message]. Standalone on purpose: it must not import
moe_overlap (the child runs with the release's path, not the package's).
"""

from __future__ import annotations

import json
import re
import sys
import warnings


def _version(text: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", text)
    major, minor, patch, rest = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4)
    return (major, minor, patch, -1 if rest and rest[:1] in ("a", "b", "r", "d", ".") and "post" not in rest else 0)


def _at_least(have: str, need: str) -> bool:
    return _version(have) >= _version(need)


def main() -> None:
    cases = json.load(sys.stdin)
    warnings.simplefilter("ignore")
    import megatron.core
    import torch  # megatron.core imports it anyway; needed for pipeline_dtype
    from megatron.core.transformer import transformer_config as tc

    out = []
    for case in cases:
        torch_v, te_v = case["torch"], case["te"]
        tc.is_torch_min_version = lambda v, check_equality=True, _t=torch_v: _at_least(_t, v)
        tc.is_te_min_version = lambda v, check_equality=True, _t=te_v: _at_least(_t, v)
        tc.get_te_version = lambda _t=te_v: _t
        kwargs = dict(case["kwargs"])
        if kwargs.get("pipeline_dtype") == "bfloat16":
            kwargs["pipeline_dtype"] = torch.bfloat16
        try:
            getattr(tc, case.get("cls", "TransformerConfig"))(**kwargs)
        except Exception as exc:  # noqa: BLE001 - every rejection is reported, the caller sorts them out
            out.append([False, type(exc).__name__, str(exc)])
        else:
            out.append([True, "", ""])
    version = getattr(megatron.core, "__version__", None)
    json.dump({"version": version, "file": tc.__file__, "results": out}, sys.stdout)


if __name__ == "__main__":
    main()
