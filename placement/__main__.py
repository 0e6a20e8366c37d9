"""``python -m placement``: the same as the ``lorafleet`` console script."""

from placement.cli import main

main()
