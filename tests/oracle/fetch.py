"""Unpack the megatron-core releases the oracle checks (and triton, and the Megatron-Bridge wheel the rules
cite) into the cache, skipping what is already there. `make oracle-releases` runs it; CI keeps the cache.

    python -m tests.oracle.fetch            # fetch what is missing, print the time of each step
    python -m tests.oracle.fetch --check    # exit 1 when something is missing

Only the package registries are needed: megatron-core >= 0.17 declares Python >= 3.12, so each release is
unpacked with pip's cross-version flags (--python-version 3.12 --only-binary=:all: --ignore-requires-python);
its config code runs on 3.11. Each item lands in a temporary folder first and is renamed when complete, so an
interrupted fetch never leaves a half-unpacked release that looks complete.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tests.oracle import releases

TRITON = "triton==3.9.0"  # a 3.11 wheel; megatron-core >= 0.18 needs `import triton` to succeed (torch.compile)
BRIDGE = "megatron-bridge==0.6.2"  # read, never imported: the Bridge lines the rules cite
CROSS = ["--python-version", "3.12", "--only-binary=:all:"]


def bridge_dir() -> Path:
    return releases.cache_dir() / "megatron-bridge-0.6.2"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def _into(target: Path, fill) -> float:
    start = time.perf_counter()
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fill(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return time.perf_counter() - start


def _bridge(tmp: Path) -> None:
    wheels = tmp / "wheel"
    _pip("download", "--no-deps", *CROSS, "-d", str(wheels), BRIDGE)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp)
    shutil.rmtree(wheels)


def megatron_lm_training(git_dir: Path) -> dict[str, float]:
    """megatron/training of each release in releases.MLM_TAGS, from a Megatron-LM git checkout (`git archive`
    of the release tag): the wheels and sdist of those releases do not ship it."""
    times: dict[str, float] = {}
    for version, tag in releases.MLM_TAGS.items():
        target = releases.mlm_training_root(version)
        if (target / "megatron" / "training" / "arguments.py").is_file():
            continue

        def fill(tmp: Path, tag=tag) -> None:
            tmp.mkdir(parents=True)
            parts = ["megatron/training", "megatron/legacy"]  # training/utils.py imports megatron.legacy
            archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", tag, *parts], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
            commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", f"{tag}^{{commit}}"], check=True,
                                    capture_output=True, text=True).stdout.strip()
            (tmp / "SOURCE").write_text(f"Megatron-LM {tag} {commit} {' '.join(parts)}\n")
        times[f"megatron-lm {tag} megatron/training"] = _into(target, fill)
    return times


def missing() -> list[str]:
    out = [v for v in releases.RELEASES if not releases.is_unpacked(v)]
    if not (bridge_dir() / "megatron" / "bridge" / "training" / "comm_overlap.py").is_file():
        out.append(BRIDGE)
    return out


def fetch() -> dict[str, float]:
    releases.cache_dir().mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    for version in releases.RELEASES:
        if not (releases.release_dir(version) / "megatron" / "core").is_dir():
            times[f"megatron-core {version}"] = _into(releases.release_dir(version), lambda tmp, v=version: _pip(
                "install", "--no-deps", "--ignore-requires-python", *CROSS, "--target", str(tmp),
                f"megatron-core=={v}"))
    if not (releases.triton_dir() / "triton" / "__init__.py").is_file():
        times[TRITON] = _into(releases.triton_dir(), lambda tmp: _pip("install", "--no-deps", "--target", str(tmp),
                                                                        TRITON))
    if BRIDGE in missing():
        times[BRIDGE] = _into(bridge_dir(), _bridge)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report what is missing (exit 1 if any)")
    parser.add_argument("--megatron-lm-git", type=Path, metavar="GIT_DIR",
                        help="a Megatron-LM git directory: unpack megatron/training of the releases whose wheels lack "
                             "it (0.16.1, tag core_v0.16.1), for the live Megatron-LM argv oracle")
    args = parser.parse_args(argv)
    if args.megatron_lm_git is not None:
        for name, seconds in megatron_lm_training(args.megatron_lm_git).items():
            print(f"oracle-releases: {name} unpacked in {seconds:.1f} s")
    if args.check:
        gone = missing()
        print("missing: " + ", ".join(gone) if gone else f"all present in {releases.cache_dir()}")
        return 1 if gone else 0
    start = time.perf_counter()
    times = fetch()
    for name, seconds in times.items():
        print(f"oracle-releases: {name} unpacked in {seconds:.1f} s")
    print(f"oracle-releases: {releases.cache_dir()} ready ({'nothing to fetch' if not times else 'fetched'}, "
          f"{time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
