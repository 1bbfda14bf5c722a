"""``moxing.framework``: where MoXing's API document places the file API
(``moxing.framework.file``); the same module as ``moxing.file`` and ``memarts.file``."""

import sys

from memarts import file

sys.modules.setdefault("moxing.framework.file", file)

__all__ = ["file"]
