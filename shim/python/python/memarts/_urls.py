"""The URL schemes that name objects (everything else is a local path), shared by ``mox.file`` and
``shift``."""

REMOTE_PREFIXES = ("s3://", "obs://", "oss://", "s3a://")


def is_remote(path):
    """Whether ``path`` is a ``str`` naming an object (``s3://``, ``obs://``, ``oss://``, ``s3a://``)."""
    return isinstance(path, str) and path.lower().startswith(REMOTE_PREFIXES)
