"""`lego images` library: real skopeo + umoci on OCI images built here from small root filesystems."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from oci_data import build_oci, to_docker_archive

from lego_rl.images import import_images, load_images_json
from lego_rl.images.importer import MARKER
from lego_rl.images.sources import candidate_names

IMG_A = "docker.io/xiaomimimo/mimo-v2.6-rl-oss:task-a"
IMG_B = "docker.io/xiaomimimo/mimo-v2.6-rl-oss:task-b"
IMG_BROKEN = "docker.io/xiaomimimo/mimo-v2.6-rl-oss:task-broken"
IMG_MISSING = "docker.io/xiaomimimo/mimo-v2.6-rl-oss:task-missing"
FILES = {"testbed/app.py": "print('hi')\n", "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n"}
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sources")
    build_oci(d / "task-a", "task-a", FILES, env=ENV, workingdir="/image/entry/dir")
    build_oci(d / "layout-b", "task-b", FILES, env=ENV)
    to_docker_archive(d / "layout-b", "task-b", d / "task-b.tar", "xiaomimimo/mimo-v2.6-rl-oss:task-b")
    (d / "task-broken.tar").write_bytes(b"this is not a tar archive" * 100)
    return d


async def test_import_writes_reference_mapping_and_reuses(tmp_path: Path, sources: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "images.json"
    seen: list[str] = []
    images = {IMG_A: "/testbed", IMG_B: "/testbed", IMG_BROKEN: "/testbed", IMG_MISSING: "/testbed"}
    rep = await import_images(images, root=root, output=out, search_dirs=[sources],
                              on_progress=lambda o: seen.append(f"{o.image.rsplit(':', 1)[1]}={o.status}"))
    assert seen == ["task-a=imported", "task-b=imported", "task-broken=failed", "task-missing=failed"]
    errors = {o.image: o.error for o in rep.outcomes if o.error}
    assert "not a readable tar archive" in errors[IMG_BROKEN]
    assert "no OCI layout or archive found" in errors[IMG_MISSING]
    mapping = json.loads(out.read_text())
    assert sorted(mapping) == [IMG_A, IMG_B]
    a = mapping[IMG_A]
    assert a["rootfs"] == str(root.resolve() / "task-a" / "rootfs")
    assert a["workdir"] == "/testbed"  # the dataset's, not the image's /image/entry/dir
    assert a["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert (Path(a["rootfs"]) / "testbed" / "app.py").read_text() == "print('hi')\n"
    # only complete bundles under root: no temp dir, nothing of the broken image
    assert sorted(p.name for p in root.iterdir()) == ["task-a", "task-b"]
    assert load_images_json(out)[IMG_B].env["LANG"] == "C.UTF-8"

    marker_mtime = (root / "task-a" / MARKER).stat().st_mtime_ns
    rep2 = await import_images({IMG_A: "/testbed"}, root=root, output=out, search_dirs=[sources])
    assert [o.status for o in rep2.outcomes] == ["reused"]
    assert (root / "task-a" / MARKER).stat().st_mtime_ns == marker_mtime
    assert sorted(json.loads(out.read_text())) == [IMG_A, IMG_B]  # entries of earlier runs are kept


async def test_changed_image_is_reimported_and_leftovers_removed(tmp_path: Path) -> None:
    src, root, out = tmp_path / "src", tmp_path / "root", tmp_path / "images.json"
    build_oci(src / "task-a", "task-a", FILES, env=ENV)
    await import_images({IMG_A: "/testbed"}, root=root, output=out, search_dirs=[src])
    (root / ".tmp-task-a-interrupted").mkdir()  # what a killed run leaves behind
    build_oci(src / "task-a", "task-a", {**FILES, "testbed/app.py": "print('v2')\n"}, env=ENV)
    rep = await import_images({IMG_A: "/testbed"}, root=root, output=out, search_dirs=[src])
    assert [o.status for o in rep.outcomes] == ["imported"]
    assert (root / "task-a" / "rootfs" / "testbed" / "app.py").read_text() == "print('v2')\n"
    assert sorted(p.name for p in root.iterdir()) == ["task-a"]


async def test_missing_workdir_is_a_broken_image(tmp_path: Path) -> None:
    src, root = tmp_path / "src", tmp_path / "root"
    build_oci(src / "task-a", "task-a", FILES, env=ENV)
    rep = await import_images({IMG_A: "/repo"}, root=root, output=tmp_path / "i.json", search_dirs=[src])
    assert rep.outcomes[0].status == "failed" and "workdir /repo does not exist" in (rep.outcomes[0].error or "")
    assert list(root.iterdir()) == []


async def test_pyenv_path_fix(tmp_path: Path) -> None:
    src, root = tmp_path / "src", tmp_path / "root"
    files = {**FILES, "root/.pyenv/version": "3.11.7\n", "root/.pyenv/versions/3.11.7/bin/python": "#!/bin/sh\n",
             "root/.pyenv/shims/python": "#!/bin/sh\n"}
    env = ["PATH=/root/.pyenv/shims:/root/.pyenv/bin:/usr/bin:/bin"]
    build_oci(src / "task-a", "task-a", files, env=env, modes={"root": 0o700})
    plain = await import_images({IMG_A: "/testbed"}, root=root, output=tmp_path / "p.json", search_dirs=[src])
    rootfs = Path(plain.mapping[IMG_A]["rootfs"])
    assert stat.S_IMODE((rootfs / "root").stat().st_mode) == 0o700  # untouched without the option
    rep = await import_images({IMG_A: "/testbed"}, root=root, output=tmp_path / "f.json", search_dirs=[src],
                              fix_path=True)
    assert rep.outcomes[0].status == "imported"  # different options: not reused
    e = rep.mapping[IMG_A]["env"]
    assert e["PATH"].split(":")[:2] == ["/root/.pyenv/versions/3.11.7/bin", "/root/.pyenv/shims"]
    assert e["PYENV_ROOT"] == "/root/.pyenv"
    assert (rootfs / "root").stat().st_mode & stat.S_IXOTH
    assert os.stat(rootfs / "root/.pyenv/versions/3.11.7/bin").st_mode & stat.S_IXOTH
    profile = (rootfs / "etc/profile.d/lego-image-path.sh").read_text()
    assert f"export PATH={e['PATH']}" in profile and "export PYENV_ROOT=/root/.pyenv" in profile


def test_candidate_names() -> None:
    assert candidate_names("docker.io/a/b:t1") == ["docker.io_a_b_t1", "b_t1", "t1"]
    assert candidate_names("localhost:5000/x") == ["localhost_5000_x", "x"]
