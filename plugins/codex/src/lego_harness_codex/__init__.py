"""lego-rl harness plugin: codex (entry point group lego_rl.harnesses)."""
