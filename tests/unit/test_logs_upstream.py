"""check_training_log on real log excerpts from upstream threads (tests/data/logs/upstream/, each file's first line
names its thread), and on messages read from the upstream sources themselves.

A clean alltoall Megatron-LM arguments block passes, with the line Megatron-LM prints for its default flex backend
too; each failing excerpt fails and names its failure, although none of them has the "Traceback (most recent call
last):" header (a log tail, interleaved ranks, a message printed by a library).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from moe_overlap.skill.diagnose.logs import check_training_log

UPSTREAM = Path(__file__).parents[1] / "data" / "logs" / "upstream"

# file -> (kind of the failure, a substring of its line, the check that fails)
FAILING = {
    "bridge_1335_deepep_dispatch_timeout.log": ("deepep", "DeepEP error: timeout (dispatch CPU)",
                                                "no-dispatcher-errors"),
    "deepep_570_timeout_check.log": ("deepep", "DeepEP timeout check failed", "no-dispatcher-errors"),
    "deepep_411_nccl_watchdog.log": ("hang", "Watchdog caught collective operation timeout", "no-hangs"),
    "megatron_lm_1301_illegal_memory_access.log": ("cuda", "an illegal memory access", "no-nccl-errors"),
    "miles_308_accelerator_error.log": ("cuda", "torch.AcceleratorError", "no-nccl-errors"),
    "megablocks_62_illegal_memory_access.log": ("cuda", "an illegal memory access", "no-nccl-errors"),
    "fastmoe_44_attribute_error.log": ("exception", "AttributeError: module 'fmoe_cuda'", "no-exceptions"),
    "bridge_5207_deepep_gb200_valueerror.log": ("exception", "Current GPU: NVIDIA GB200", "no-exceptions"),
    "megatron_lm_1877_alltoall_runtime_error.log": ("exception", "RuntimeError: shape '[2048, 1, 4096]'",
                                                    "no-exceptions"),
    "bridge_3599_hybridep_permute_assert.log": ("hybridep", "hybrid_ep/extension/permute.cu:412",
                                                "no-dispatcher-errors"),
    # The assert's own line does not name HybridEP (its file is on the line before): a native crash.
    "megatron_lm_3999_hybridep_qp_assert.log": ("crash", "Assertion `tx_depth > 0", "no-exceptions"),
    "bridge_5051_hybridep_segfault.log": ("hybridep", "HybridEPBuffer::allocate_buffer", "no-dispatcher-errors"),
    "megatron_lm_5921_mtp_overlap_assertion.log": ("assertion", "MTP layernum only supports 1",
                                                   "no-overlap-config-assertion"),
}
CLEAN = (
    "megatron_lm_alltoall_args.log", "megatron_lm_1532_alltoall_args.log",
    "megatron_llm_22_iterations.log")


def _read(name: str) -> str:
    text = (UPSTREAM / name).read_text()
    assert text.startswith("# source: https://github.com/"), f"{name} must name its thread on its first line"
    return text


def test_every_fixture_names_its_source_and_is_short():
    files = sorted(p.name for p in UPSTREAM.glob("*.log"))
    assert set(FAILING) | set(CLEAN) == set(files)
    for name in files:
        assert len(_read(name).splitlines()) <= 40, name


def test_clean_alltoall_megatron_lm_arguments_pass():
    """The arguments excerpt, then the iteration lines of another thread: as a Megatron-LM log reads."""
    text = _read("megatron_lm_alltoall_args.log") + _read("megatron_llm_22_iterations.log")
    for part in (text, *map(_read, CLEAN)):
        res = check_training_log(part, expect_overlap=None)
        assert res.ok, [c for c in res.checks if c.status == "fail"]
        assert res.failure is None and not res.errors
        assert res.format == "megatron-lm"
    res = check_training_log(text, expect_overlap=None)
    assert res.effective_config["moe_token_dispatcher_type"] == "alltoall"
    # Megatron-LM prints every TransformerConfig argument, so the default backend (deepep: megatron-core 0.19.2
    # transformer_config.py:869) is in every log, alltoall ones too: it must not fail the check.
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "moe_per_layer_logging" in line)
    lines.insert(at, "  moe_flex_dispatcher_backend ..................... deepep")
    res = check_training_log("\n".join(lines) + "\n", expect_overlap=None)
    assert res.ok, [c for c in res.checks if c.status == "fail"]
    assert next(c for c in res.checks if c.id == "flex-backend-active").status == "info"


@pytest.mark.parametrize("name", sorted(FAILING))
def test_each_failing_excerpt_names_its_failure(name):
    kind, text, check = FAILING[name]
    res = check_training_log(_read(name), expect_overlap=None)
    assert not res.ok
    assert res.failure is not None, res.errors
    assert res.failure.kind == kind and text in res.failure.text, res.failure
    assert next(c for c in res.checks if c.id == check).status == "fail"
    assert next(c for c in res.checks if c.id == "no-tracebacks").status == "pass"  # no header in any of them
    assert all(e.line > 1 for e in res.errors), res.errors  # the source line's prose is no error


def _source_message(path: Path, first: int, count: int) -> str:
    lines = path.read_text().splitlines()[first - 1:first - 1 + count]
    return "".join(part.split('"')[1] for part in lines if '"' in part)


def test_messages_from_the_upstream_sources_are_named():
    """HybridEP's "not installed" (Megatron-Core's dispatcher) and Bridge's flex ValueError, read from the wheels."""
    from tests.oracle import releases
    from tests.oracle.fetch import bridge_dir

    core = releases.release_dir("0.19.2") / "megatron/core/transformer/moe/token_dispatcher.py"
    bridge = bridge_dir() / "megatron/bridge/training/flex_dispatcher_backend.py"
    if not (core.is_file() and bridge.is_file()):
        pytest.skip("megatron-core 0.19.2 / megatron-bridge 0.6.2 not unpacked (`make oracle-releases`)")
    hybrid = _source_message(core, 1049, 2)
    assert hybrid.startswith("HybridEP is not installed"), hybrid
    res = check_training_log(f"[rank0]: ImportError: {hybrid}\n", expect_overlap=None)
    assert res.failure.kind == "hybridep" and not res.ok
    deepep_gpu = _source_message(bridge, 111, 1)
    assert deepep_gpu.startswith("DeepEP is supported for"), deepep_gpu
    res = check_training_log(f"ValueError: {deepep_gpu}Current GPU: Tesla V100-SXM2-32GB\n", expect_overlap=None)
    assert res.failure.kind == "exception" and not res.ok


def test_error_matching_stays_linear_on_long_hostile_lines():
    # Near-misses of every error pattern, many times over, on one long line and on many lines.
    unit = "RuntimeErro HybridEP" + " x" * 40 + " DeepEP erro CUDA erro Watchdog caught "
    for text in (unit * 15000, (unit + "\n") * 15000):  # about 2 MB each
        start = time.perf_counter()
        res = check_training_log(text, expect_overlap=None)
        assert time.perf_counter() - start < 5.0
        assert res.failure is None


def test_a_line_of_two_kinds_is_kept_once_under_the_more_specific():
    res = check_training_log("[rank3]: RuntimeError: DeepEP error: timeout (dispatch CPU)\n", expect_overlap=None)
    assert [e.kind for e in res.errors] == ["deepep"]
    assert {c.id for c in res.checks if c.status == "fail"} == {"no-dispatcher-errors", "no-exceptions"}
    # A name that only ends in "Error:" is no exception line.
    assert check_training_log("MyFooError: fine\n", expect_overlap=None).ok
