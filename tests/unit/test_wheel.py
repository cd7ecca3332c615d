"""The wheel carries the data: build it, install it into a fresh venv, read the card with no checkout around."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LIGHT_DEPS = ["pydantic>=2.7", "pyyaml>=6.0", "jsonschema>=4.18"]  # all `moe-overlap card` imports


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow
def test_wheel_serves_the_card_without_a_checkout(tmp_path):
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("needs a source checkout to build from")
    dist = tmp_path / "dist"
    # hatchling straight from this environment: no isolated build env, so no network for the build itself.
    _run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(dist)], cwd=ROOT, timeout=300)
    (wheel,) = dist.glob("moe_overlap-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, clear=True)  # ensurepip costs ~30 s; this pip installs into it
    py = env_dir / "bin" / "python"
    env = _clean_env()
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q"]
    # --no-deps: torch, megatron-core and mcp are not needed to read a card; only the light deps are.
    _run([*pip, "--no-deps", str(wheel)], env=env, timeout=300)
    _run([*pip, *LIGHT_DEPS], env=env, timeout=600)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    exe = env_dir / "bin" / "moe-overlap"
    proc = _run([str(exe), "card", "perf-expert-parallel-overlap", "--field", "summary"], cwd=outside, env=env,
                timeout=120)
    card = yaml.safe_load((ROOT / "skills" / "perf-expert-parallel-overlap" / "card.yaml").read_text())
    assert proc.stdout.strip() == " ".join(card["summary"].split())

    # The data really comes from the installed package, not from this checkout.
    where = _run([str(py), "-c", "import moe_overlap.paths as p; print(p.data_root())"], cwd=outside, env=env,
                 timeout=60).stdout.strip()
    assert where.startswith(str(env_dir)) and where.endswith("_data"), where
    for rel in ("skills/perf-expert-parallel-overlap/SKILL.md", "skills/perf-expert-parallel-overlap/evals/evals.json",
                "schemas/card.schema.json", "skills/perf-expert-parallel-overlap/references/communication-overlap.md",
                "skills/perf-expert-parallel-overlap/assets/ep-overlap-minimal.yaml",
                "skills/perf-expert-parallel-overlap/references/runtime-failures.yaml"):
        assert (Path(where) / rel).is_file(), rel
    # The verification's corpus ships beside the module that reads it (verify/run/data/corpus.txt).
    corpus = _run([str(py), "-c", "from moe_overlap.verify.run.corpus import CORPUS_PATH, corpus_bytes; "
                   "print(CORPUS_PATH, len(corpus_bytes()))"], cwd=outside, env=env, timeout=60).stdout.split()
    assert corpus[0].startswith(str(env_dir)) and int(corpus[1]) > 1000, corpus
    # diagnose reads the runtime failure modes from the installed data too
    diag = _run([str(exe), "diagnose", "RuntimeError: DeepEP error: timeout (dispatch CPU)"], cwd=outside, env=env,
                timeout=120)
    assert "deepep-dispatch-timeout" in diag.stdout

    # An unknown field is still exit 2 with the choices, from the installed wheel.
    bad = subprocess.run([str(exe), "card", "perf-expert-parallel-overlap", "--field", "nope"], cwd=outside,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "summary" in bad.stderr
