"""lego-rl harness plugin: claude_code (entry point group lego_rl.harnesses)."""
