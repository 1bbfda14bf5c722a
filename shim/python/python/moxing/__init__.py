"""``moxing``: the name MoXing scripts import, served by memarts.

``import moxing as mox`` gives the same objects as ``import memarts as mox``: ``mox.file`` *is*
``memarts.file`` (one module, one client, one set of settings), so a script written for MoXing runs
unchanged. Only the file API exists here; MoXing's other parts (``mox.tensorflow``...) do not.

This package is installed by the ``memarts`` wheel. It cannot coexist with the real MoXing wheel in
one environment (both own the top-level name ``moxing``; whichever was installed last wins): install
memarts in its own virtualenv, or keep the real MoXing and write ``import memarts as mox``.
"""

import sys

from memarts import errors, file, stats
from memarts.errors import Error

from . import framework

# MoXing's implementation module, which some scripts reach into to set flags
# (``mox.file.file_io._SOME_FLAG = ...``): here it is the file module itself, so such assignments
# land somewhere harmless and reading a flag the script set gives it back.
file.file_io = file
sys.modules.setdefault("moxing.file", file)

__all__ = ["Error", "errors", "file", "framework", "stats"]
