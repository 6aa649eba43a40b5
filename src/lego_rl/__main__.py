"""``python -m lego_rl ...`` is ``lego ...``: for launchers that take a module (``torchrun -m lego_rl train``) and
for machines where the package is on PYTHONPATH without its console script."""

from lego_rl.cli.main import main

main()
