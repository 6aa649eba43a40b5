"""Turn records: re-exported from the run store (``lego_rl.runstore.turns``), where the model lives so the
monitor can read what the adapter writes without importing trajectory."""

from lego_rl.runstore.turns import RenderMode, TurnKind, TurnRecord

__all__ = ["RenderMode", "TurnKind", "TurnRecord"]
