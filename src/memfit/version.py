"""memfit's version, in the lowest layer: the run logs, the caches' keys and the pages that name
the version read it here, below the public API that re-exports it (``memfit.__version__``)."""

__version__ = "0.1.0"
