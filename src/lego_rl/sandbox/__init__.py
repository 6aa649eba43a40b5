"""Sandboxes: the contract (``base``), the provider registry (``factory``) and the providers."""

from lego_rl.sandbox.base import ExecResult, ImageSpec, Sandbox, SandboxProvider, cut_message
from lego_rl.sandbox.factory import available_providers, create_sandbox, get_provider, resolve_image

__all__ = [
    "ExecResult",
    "ImageSpec",
    "Sandbox",
    "SandboxProvider",
    "available_providers",
    "create_sandbox",
    "cut_message",
    "get_provider",
    "resolve_image",
]
