"""Command sessions: what one ``lego`` command does, so the CLI only parses and renders. Each session reads
the resolved config through ``lego_rl.compose`` and drives the parts below it."""
