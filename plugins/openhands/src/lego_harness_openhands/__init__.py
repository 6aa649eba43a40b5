"""lego-rl harness plugin: openhands (entry point group lego_rl.harnesses)."""
