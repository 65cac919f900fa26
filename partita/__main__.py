"""``python -m partita``: the same as the ``partita`` command."""

from .cli import main

raise SystemExit(main())
