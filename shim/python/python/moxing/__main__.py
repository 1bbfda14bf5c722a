"""``python -m moxing ...``: the same as the ``moxing`` command (see :mod:`moxing.command`)."""

from .command import main

raise SystemExit(main())
