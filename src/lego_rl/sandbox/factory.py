"""Provider registry and ``create_sandbox``.

Providers are found by name in the entry point group ``lego_rl.sandbox_providers`` (so a third party
adds one with ``pip install``), over a built-in table that keeps the three shipped providers usable
from a source checkout whose metadata is stale. An entry point of the same name wins over the
built-in, which lets a deployment swap an implementation without forking lego-rl.

``create_sandbox`` returns an object that is both awaitable and an async context manager::

    async with create_sandbox(spec, provider="bwrap", network="host") as sb: ...
    sb = await create_sandbox("/var/cache/lego-rl/rootfs-bookworm")   # caller must close()
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Generator, Mapping
from importlib.metadata import entry_points
from typing import Any

from lego_rl.errors import SandboxError
from lego_rl.sandbox.base import ImageSpec, Sandbox, SandboxProvider

ENTRY_POINT_GROUP = "lego_rl.sandbox_providers"
DEFAULT_PROVIDER = "bwrap"

BUILTIN_PROVIDERS: dict[str, str] = {
    "bwrap": "lego_rl.sandbox.bwrap:BwrapProvider",
    "sunabako": "lego_rl.sandbox.sunabako_provider:SunabakoProvider",
    "e2b": "lego_rl.sandbox.e2b_provider:E2BProvider",
}


def available_providers() -> dict[str, str]:
    """Name -> ``module:attr`` of every registered provider (built-ins overlaid by entry points)."""
    found = dict(BUILTIN_PROVIDERS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value
    return dict(sorted(found.items()))


def provider_class(name: str) -> type[SandboxProvider]:
    """Import the class registered under ``name``; a precise error names the known providers."""
    known = available_providers()
    target = known.get(name)
    if target is None:
        raise SandboxError(f"unknown sandbox provider {name!r}; known providers: {', '.join(known)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SandboxError(
            f"sandbox provider {name!r} ({target}) cannot be imported: {exc}; "
            f"install its extra (pip install 'lego-rl[{name}]') or pick another provider"
        ) from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, SandboxProvider)):
        raise SandboxError(f"sandbox provider {name!r}: {target} is not a SandboxProvider subclass")
    return cls


def get_provider(name: str, **options: Any) -> SandboxProvider:
    """Instantiate provider ``name`` with its provider-wide ``options`` (node, state dir, key...)."""
    cls = provider_class(name)
    try:
        return cls(**options)
    except TypeError as exc:
        raise SandboxError(f"sandbox provider {name!r} rejected its options {sorted(options)}: {exc}") from exc


def resolve_image(image: ImageSpec | str, images: Mapping[str, ImageSpec] | None = None) -> ImageSpec:
    """Turn what a caller names into an ImageSpec.

    A string is looked up in ``images`` (an images.json mapping already loaded by the caller) first;
    otherwise ``"host"`` means the host's root filesystem and an absolute directory is a rootfs.
    """
    if isinstance(image, ImageSpec):
        return image
    if images is not None and image in images:
        return images[image]
    if image == "host":
        return ImageSpec(name="host", rootfs=None)
    if os.path.isabs(image) and os.path.isdir(image):
        return ImageSpec(name=image, rootfs=image)
    hint = f" and it is not one of the {len(images)} images in the mapping" if images is not None else ""
    raise SandboxError(
        f"image {image!r} is neither 'host' nor an absolute rootfs directory{hint}; "
        "pass an ImageSpec or an images.json mapping (lego images)"
    )


class SandboxContext:
    """Awaitable and ``async with``-able handle on a sandbox being created.

    Under ``async with`` the sandbox is closed on exit, and a provider that this handle created
    itself (``provider`` given by name) is closed too.
    """

    def __init__(self, provider: SandboxProvider, image: ImageSpec, options: dict[str, Any], owns: bool):
        self._provider = provider
        self._image = image
        self._options = options
        self._owns = owns
        self._sandbox: Sandbox | None = None

    async def _create(self) -> Sandbox:
        try:
            return await self._provider.create(self._image, **self._options)
        except BaseException:
            if self._owns:
                await self._provider.aclose()
            raise

    def __await__(self) -> Generator[Any, None, Sandbox]:
        return self._create().__await__()

    async def __aenter__(self) -> Sandbox:
        self._sandbox = await self._create()
        return self._sandbox

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._sandbox is not None:
                await self._sandbox.close()
        finally:
            if self._owns:
                await self._provider.aclose()


def create_sandbox(
    image: ImageSpec | str,
    *,
    provider: str | SandboxProvider = DEFAULT_PROVIDER,
    provider_options: Mapping[str, Any] | None = None,
    images: Mapping[str, ImageSpec] | None = None,
    **options: Any,
) -> SandboxContext:
    """Create a sandbox of ``image`` with ``provider`` (a name or an instance).

    ``provider_options`` go to the provider's constructor when it is given by name; ``options``
    (``memory_mb``, ``network``, ...) go to ``provider.create`` for this one sandbox.
    """
    spec = resolve_image(image, images)
    if isinstance(provider, SandboxProvider):
        if provider_options:
            raise SandboxError("provider_options apply only when the provider is given by name")
        return SandboxContext(provider, spec, dict(options), owns=False)
    return SandboxContext(get_provider(provider, **dict(provider_options or {})), spec, dict(options), owns=True)
