"""voicert: a streaming real-time voice agent backend."""

__version__ = "0.1.0"
