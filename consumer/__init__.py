"""arrowagg's consumer daemon: decode, window, aggregate, emit, commit."""

__version__ = "0.1.0"
