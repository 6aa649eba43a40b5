"""`lego toolchain fetch` and `Toolchain.resolve`: integrity is checked at download and at install.

Most tests talk to a *registry double*: a real aiohttp server on 127.0.0.1 that answers the two npm
registry routes fetch uses (version document, tarball), so corrupt and mismatching answers can be
served on purpose. One slow test fetches a real 5 kB tarball from the npm registry.
"""

from __future__ import annotations

import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness_helpers import Registry, make_tgz, sri, start_registry

from lego_rl.errors import ConfigError, HarnessError
from lego_rl.harness import Toolchain, ToolchainPin
from lego_rl.harness.fetch import fetch_toolchain
from lego_rl.harness.toolchain import LOCKFILE, LockEntry, Lockfile, sha512_integrity


@pytest.fixture
async def registry(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Registry]:
    reg, runner = await start_registry()
    monkeypatch.setenv("npm_config_registry", reg.url)
    yield reg
    await runner.cleanup()


def tarball_bytes(tmp_path: Path, text: str) -> bytes:
    return make_tgz(tmp_path / f"src-{abs(hash(text))}.tgz", {"package.json": text}).read_bytes()


async def test_fetch_downloads_verifies_records_and_skips_when_current(
    registry: Registry, tmp_path: Path
) -> None:
    data = tarball_bytes(tmp_path, '{"name":"@acme/cli"}')
    registry.tarballs[("@acme/cli", "1.0.0")] = data
    pin = ToolchainPin(role="cli", kind="npm", name="@acme/cli", version="1.0.0", integrity=sri(data))
    folder = tmp_path / "tc"
    [(entry, fetched)] = await fetch_toolchain([pin], folder)
    assert fetched and entry.integrity == sri(data) == entry.registry_integrity
    assert (folder / entry.file).read_bytes() == data and entry.file == "npm/acme-cli-1.0.0.tgz"
    assert Lockfile.load(folder).entries[pin.key] == entry
    [(_, fetched_again)] = await fetch_toolchain([pin, pin], folder)
    assert not fetched_again and registry.downloads == 1
    assert Toolchain(folder).resolve(pin) == (folder / entry.file).resolve()


async def test_fetch_refuses_registry_hash_that_differs_from_the_pin(
    registry: Registry, tmp_path: Path
) -> None:
    data = tarball_bytes(tmp_path, "{}")
    registry.tarballs[("cli", "2.0.0")] = data
    pin = ToolchainPin(role="cli", kind="npm", name="cli", version="2.0.0", integrity=sri(b"what we pinned"))
    with pytest.raises(HarnessError, match="differs from the plugin's pin"):
        await fetch_toolchain([pin], tmp_path / "tc")
    assert not (tmp_path / "tc" / LOCKFILE).exists() and registry.downloads == 0


async def test_fetch_refuses_bytes_that_do_not_match_the_published_hash(
    registry: Registry, tmp_path: Path
) -> None:
    registry.tarballs[("cli", "3.0.0")] = tarball_bytes(tmp_path, "{}")
    registry.lie.add(("cli", "3.0.0"))
    pin = ToolchainPin(role="cli", kind="npm", name="cli", version="3.0.0")
    with pytest.raises(HarnessError, match="does not match the registry's dist.integrity"):
        await fetch_toolchain([pin], tmp_path / "tc")
    assert list((tmp_path / "tc" / "npm").iterdir()) == []  # nothing half-written left behind
    assert not (tmp_path / "tc" / LOCKFILE).exists()


async def test_fetch_of_unknown_version_is_a_config_error(registry: Registry, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="npm registry has no cli@9.9.9"):
        await fetch_toolchain([ToolchainPin(role="cli", kind="npm", name="cli", version="9.9.9")], tmp_path)


async def test_resolve_refuses_mismatching_files(registry: Registry, tmp_path: Path) -> None:
    data = tarball_bytes(tmp_path, '{"v":1}')
    registry.tarballs[("cli", "1.0.0")] = data
    folder = tmp_path / "tc"
    unpinned = ToolchainPin(role="cli", kind="npm", name="cli", version="1.0.0")
    [(entry, _)] = await fetch_toolchain([unpinned], folder)
    tc = Toolchain(folder)
    # An operator's override must match the lockfile's hash when the plugin pins none ...
    other = make_tgz(tmp_path / "other.tgz", {"package.json": "{}"})
    with pytest.raises(HarnessError, match="refusing .*other.tgz.*does not match the pin"):
        tc.resolve(unpinned, override=other)
    assert tc.resolve(unpinned, override=folder / entry.file) == folder / entry.file
    # ... and the plugin's own pin when it has one.
    pinned = unpinned.model_copy(update={"integrity": sri(b"x")})
    with pytest.raises(HarnessError, match="lockfile records .* but the plugin pins"):
        tc.resolve(pinned)
    # A file changed after the fetch is caught too.
    (folder / entry.file).write_bytes(data + b"tampered")
    with pytest.raises(HarnessError, match="does not match the pin"):
        tc.resolve(unpinned)
    with pytest.raises(HarnessError, match="run `lego toolchain fetch`"):
        tc.resolve(ToolchainPin(role="cli", kind="npm", name="absent", version="1"))
    with pytest.raises(HarnessError, match="does not exist"):
        tc.resolve(unpinned, override=tmp_path / "missing.tgz")


def test_corrupt_lockfile_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / LOCKFILE).write_text('{"version": 1, "entries": {"x": {"kind": "npm"}}}')
    with pytest.raises(ConfigError, match=LOCKFILE):
        Toolchain(tmp_path).lockfile()


@pytest.mark.slow
async def test_real_registry_fetch_matches_the_codex_plugins_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lego_harness_codex.harness import KNOWN

    monkeypatch.delenv("npm_config_registry", raising=False)
    pin = ToolchainPin(
        role="cli",
        kind="npm",
        name="@openai/codex",
        version="0.162.1",
        integrity=KNOWN[("@openai/codex", "0.162.1")],
    )
    [(entry, fetched)] = await fetch_toolchain([pin], tmp_path)
    assert fetched and entry.source.startswith("https://registry.npmjs.org/@openai/codex/-/")
    assert sha512_integrity(tmp_path / entry.file) == pin.integrity


async def test_fetch_keeps_going_and_reports_every_failure(registry: Registry, tmp_path: Path) -> None:
    good = tarball_bytes(tmp_path, '{"ok":1}')
    registry.tarballs[("good", "1.0.0")] = good
    pins = [ToolchainPin(role="cli", kind="npm", name="missing", version="1.0.0"),
            ToolchainPin(role="cli", kind="npm", name="good", version="1.0.0")]  # fmt: skip
    failures: list[tuple[ToolchainPin, Exception]] = []
    [(entry, fetched)] = await fetch_toolchain(pins, tmp_path / "tc", failures=failures)
    assert fetched and entry.name == "good"
    [(pin, exc)] = failures
    assert pin.name == "missing" and "npm registry has no missing@1.0.0" in str(exc)
    assert list(Lockfile.load(tmp_path / "tc").entries) == ["npm:good@1.0.0"]


async def test_a_site_tree_for_one_python_does_not_stand_in_for_another(tmp_path: Path) -> None:
    """Binary wheels load on one minor version: a tree fetched for 3.12 is not current for a 3.13 pin
    (it was, under one key per package version, and a 3.13 sandbox got the 3.12 tree)."""
    folder = tmp_path / "tc"
    tree = make_tgz(tmp_path / "site.tgz", {"sdk/__init__.py": ""}, top="site")
    (folder / "pypi").mkdir(parents=True)
    (folder / "pypi" / "sdk-1.0-py3.12-site.tgz").write_bytes(tree.read_bytes())
    pins = {v: ToolchainPin(role="site", kind="pypi", name="sdk", version="1.0", with_dependencies=True,
                            python_version=v) for v in ("3.12", "3.13")}  # fmt: skip
    entry = LockEntry(kind="pypi", name="sdk", version="1.0", file="pypi/sdk-1.0-py3.12-site.tgz",
                      integrity=sri(tree.read_bytes()), size=tree.stat().st_size, source="test",
                      fetched_at="2026-01-01T00:00:00Z", python_version="3.12")  # fmt: skip
    Lockfile(entries={entry.key: entry}).save(folder)
    assert entry.key == pins["3.12"].key == "pypi:sdk@1.0+py3.12" != pins["3.13"].key
    assert Lockfile.load(folder).entries == {"pypi:sdk@1.0+py3.12": entry}
    tc = Toolchain(folder)
    assert tc.resolve(pins["3.12"]) == (folder / entry.file).resolve()
    with pytest.raises(HarnessError, match=r"pypi:sdk@1.0\+py3.13 .*is not in the toolchain"):
        tc.resolve(pins["3.13"])
    # fetch skips the current 3.12 tree and builds the 3.13 one (here with an interpreter that is missing).
    failures: list[tuple[ToolchainPin, Exception]] = []
    [(kept, fetched)] = await fetch_toolchain(
        list(pins.values()), folder, python=str(tmp_path / "no-python3.13"), failures=failures
    )
    assert kept == entry and not fetched
    [(pin, exc)] = failures
    assert pin == pins["3.13"] and "no-python3.13" in str(exc)


@pytest.mark.slow
async def test_a_runtime_is_built_by_the_named_interpreter_and_checked(tmp_path: Path) -> None:
    """The runtime builder runs under --python; an interpreter of another minor version is refused."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    pin = ToolchainPin(role="runtime", kind="runtime", name="python", version=here, with_dependencies=True)
    [(entry, fetched)] = await fetch_toolchain([pin], tmp_path, python=sys.executable)
    assert fetched and entry.kind == "runtime" and entry.file == f"runtime/python-{here}.tgz"
    assert Toolchain(tmp_path).resolve(pin) == tmp_path / entry.file
    with tarfile.open(tmp_path / entry.file) as tar:
        names = set(tar.getnames())
    assert {f"python/bin/python{here}", f"python/libexec/python{here}", "python/libexec/lib/libc.so.6",
            f"python/lib/python{here}/os.py"} <= names  # fmt: skip
    other = pin.model_copy(update={"version": "3.99"})
    with pytest.raises(HarnessError, match=rf"--python .* is python{here}, not python3.99"):
        await fetch_toolchain([other], tmp_path, python=sys.executable)
