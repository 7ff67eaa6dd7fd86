"""``python -m bo_online.cli``: the ``bo-online`` command."""

from bo_online.cli.entry import main

main()
