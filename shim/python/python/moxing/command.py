"""The ``moxing`` command: MoXing's shell spelling of the memarts CLI.

MoXing's documentation has scripts run ``moxing stop_memarts_proxy`` then
``moxing start_memarts_proxy 8``; here they run ``memarts stop_proxy`` and ``memarts start_proxy 8``
(the same binary, the same code). Any other arguments go to ``memarts`` unchanged, so
``moxing status`` is ``memarts status``.

The ``memarts`` binary is the one in ``MEMARTS_BIN_DIR`` if that is set, else the first on ``PATH``.
"""

import os
import shutil
import sys

# MoXing's subcommand names -> the memarts CLI's.
ALIASES = {
    "start_memarts_proxy": "start_proxy",
    "stop_memarts_proxy": "stop_proxy",
}


def memarts_binary():
    """The path of the ``memarts`` CLI, or None when neither ``MEMARTS_BIN_DIR`` nor ``PATH`` has it."""
    bin_dir = os.environ.get("MEMARTS_BIN_DIR")
    if bin_dir:
        path = os.path.join(bin_dir, "memarts")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("memarts")


def translate(args):
    """The ``memarts`` arguments for ``moxing`` arguments ``args`` (the first one renamed if MoXing's)."""
    if not args:
        return []
    return [ALIASES.get(args[0], args[0]), *args[1:]]


def main(argv=None):
    """Runs ``memarts`` with the translated arguments in place of this process; returns 2 (with a
    message on stderr) when the binary cannot be found."""
    args = translate(list(sys.argv[1:] if argv is None else argv))
    binary = memarts_binary()
    if binary is None:
        where = f"MEMARTS_BIN_DIR={os.environ['MEMARTS_BIN_DIR']}" if os.environ.get("MEMARTS_BIN_DIR") else "PATH"
        sys.stderr.write(
            f"moxing: the memarts binary is not in {where}; build it (cargo build --release -p memarts-ops) "
            "and put it on PATH, or set MEMARTS_BIN_DIR to its directory\n"
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [binary, *args])
    return 0  # not reached
