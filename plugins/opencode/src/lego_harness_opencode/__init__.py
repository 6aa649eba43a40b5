"""lego-rl harness plugin: opencode (entry point group lego_rl.harnesses)."""
