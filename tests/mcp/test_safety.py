"""Path confinement, partial reads of huge files, and the HTTP bind rules (no server needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from moe_overlap.mcp.safety import AllowedRoots, read_text_file
from moe_overlap.server import is_loopback, main, transport_security


@pytest.fixture
def roots(tmp_path):
    inside = tmp_path / "inside"
    (inside / "sub").mkdir(parents=True)
    (inside / "sub" / "a.log").write_text("hello\n")
    (tmp_path / "outside.log").write_text("secret\n")
    return AllowedRoots.from_paths([inside]), inside, tmp_path


def test_paths_inside_are_resolved(roots):
    allowed, inside, _ = roots
    assert allowed.resolve_file("sub/a.log", field="path") == (inside / "sub" / "a.log").resolve()
    assert allowed.resolve_file(str(inside / "sub" / "a.log"), field="path").name == "a.log"


@pytest.mark.parametrize("raw,words", [
    ("../outside.log", "'..'"),
    ("sub/../../outside.log", "'..'"),
    ("", "not a usable path"),
    ("a\x00b", "not a usable path"),
    ("sub", "not a regular file"),
    ("nope.log", "no such file"),
])
def test_bad_paths_refused(roots, raw, words):
    allowed, _, _ = roots
    with pytest.raises(ToolError) as err:
        allowed.resolve_file(raw, field="path")
    assert words in str(err.value) and "`path`" in str(err.value) and "Fix" in str(err.value)


def test_absolute_and_symlink_escapes_refused(roots):
    allowed, inside, tmp = roots
    with pytest.raises(ToolError, match="outside the allowed"):
        allowed.resolve_file(str(tmp / "outside.log"), field="path")
    os.symlink(tmp / "outside.log", inside / "link.log")
    os.symlink(tmp, inside / "dirlink")
    for raw in ("link.log", "dirlink/outside.log"):
        with pytest.raises(ToolError, match="symbolic link"):
            allowed.resolve_file(raw, field="path")


def test_huge_file_keeps_head_and_tail(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("CONFIG overlap_moe_expert_parallel_comm True\n" + "x" * 10_000 + "\nTraceback: the end\n")
    text, omitted = read_text_file(log, max_bytes=800)
    assert text.startswith("CONFIG") and text.endswith("the end\n")
    assert omitted == log.stat().st_size - 800 and f"{omitted} bytes of train.log omitted" in text
    assert read_text_file(log, max_bytes=1 << 20) == (log.read_text(), 0)


def test_loopback_detection():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.5", "example.com", "::"))


def test_dns_rebinding_protection_always_on():
    local = transport_security("127.0.0.1", 8765, [])
    assert local.enable_dns_rebinding_protection and "127.0.0.1:*" in local.allowed_hosts
    assert not any(h.startswith("10.") for h in local.allowed_hosts)
    remote = transport_security("10.0.0.7", 8765, ["gpu-box"])
    assert remote.enable_dns_rebinding_protection
    assert {"10.0.0.7:*", "gpu-box:*"} <= set(remote.allowed_hosts)


def test_non_loopback_bind_needs_allow_remote(capsys):
    assert main(["--transport", "streamable-http", "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr()
    assert "--allow-remote" in err.err and err.out == ""


def test_default_root_is_cwd_but_never_root_or_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert AllowedRoots.default().roots == (tmp_path.resolve(),)
    for folder in ("/", str(Path.home())):
        monkeypatch.chdir(folder)
        none = AllowedRoots.default()
        assert none.roots == ()
        with pytest.raises(ToolError, match="no allowed folder"):
            none.resolve_file("etc/passwd", field="path")


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(tmp_path):
    """The path is resolved and checked, then opened component by component with O_NOFOLLOW: a folder replaced
    by a link to the outside in between makes the open fail instead of escaping (issue 15)."""
    from moe_overlap.mcp.safety import _open_below

    inside = tmp_path / "inside"
    (inside / "sub").mkdir(parents=True)
    (inside / "sub" / "a.log").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.log").write_text("secret\n")
    (inside / "sub").rename(tmp_path / "moved")
    os.symlink(outside, inside / "sub")  # the swap, after a resolve that saw a real folder
    with pytest.raises(ToolError, match="changed while it was being opened"):
        _open_below(inside.resolve(), ("sub", "a.log"), "sub/a.log", "path")


def test_racing_link_swaps_never_leak_the_outside(tmp_path):
    import threading

    from moe_overlap.mcp.safety import read_text_fd

    inside = tmp_path / "inside"
    inside.mkdir()
    real, outside = tmp_path / "real", tmp_path / "outside"
    for folder, text in ((real, "inside\n"), (outside, "secret\n")):
        folder.mkdir()
        (folder / "a.log").write_text(text)
    os.rename(real, inside / "d")
    allowed = AllowedRoots.from_paths([inside])
    stop = threading.Event()

    def swap():  # flip inside/d between a real folder and a link to the outside, as fast as possible
        while not stop.is_set():
            os.rename(inside / "d", tmp_path / "held")
            os.symlink(outside, inside / "d")
            os.unlink(inside / "d")
            os.rename(tmp_path / "held", inside / "d")

    thread = threading.Thread(target=swap)
    thread.start()
    seen = set()
    try:
        for _ in range(300):
            try:
                fd, _path = allowed.open_file("d/a.log", field="path")
            except ToolError:
                continue
            try:
                seen.add(read_text_fd(fd, max_bytes=100, name="a.log")[0])
            finally:
                os.close(fd)
    finally:
        stop.set()
        thread.join()
    assert "secret\n" not in seen


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_special_files_inside_are_refused_without_blocking(tmp_path, kind):
    inside = tmp_path / "inside"
    inside.mkdir()
    if kind == "fifo":
        os.mkfifo(inside / "x.log")
    else:
        (inside / "x.log").mkdir()
    with pytest.raises(ToolError, match="not a regular file"):
        AllowedRoots.from_paths([inside]).open_file("x.log", field="path")


def test_a_symlinked_allowed_folder_serves_its_files_and_a_link_out_of_it_is_refused(tmp_path):
    """Issue 34: the repo's own examples/ is a link; its files were refused as 'outside the allowed folders'."""
    real = tmp_path / "assets"
    real.mkdir()
    (real / "a.yaml").write_text("model: {}\n")
    (tmp_path / "secret.yaml").write_text("secret\n")
    (real / "out.yaml").symlink_to(tmp_path / "secret.yaml")
    (tmp_path / "examples").symlink_to(real, target_is_directory=True)
    allowed = AllowedRoots.from_paths([tmp_path / "examples"])
    for raw in ("a.yaml", str(tmp_path / "examples" / "a.yaml"), str(real / "a.yaml")):
        assert allowed.resolve_file(raw, field="path") == (real / "a.yaml").resolve()
    for raw in ("out.yaml", str(tmp_path / "examples" / "out.yaml")):
        with pytest.raises(ToolError, match="symbolic link"):
            allowed.resolve_file(raw, field="path")
    with pytest.raises(ToolError, match="outside the allowed"):
        allowed.resolve_file(str(tmp_path / "secret.yaml"), field="path")


def test_the_repos_examples_link_over_mcp():
    """The server started with --allowed-dir examples (a link in this repository) validates a file in it."""
    from tests.mcp.stdio_session import REPO, StdioSession, initialize_request

    examples = REPO / "examples"
    assert examples.is_symlink()
    name = sorted(p.name for p in examples.iterdir() if p.suffix == ".yaml")[0]
    session = StdioSession("--allowed-dir", str(examples))
    try:
        session.send(initialize_request(1))
        session.wait_for(1, timeout=60)
        session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "validate_config", "arguments": {"config_path": str(examples / name)}}})
        result = session.wait_for(2, timeout=60)["result"]
        assert not result.get("isError"), result
    finally:
        session.close()
