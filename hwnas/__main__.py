"""``python -m hwnas``: the command line."""

from hwnas.cli import main

raise SystemExit(main())
