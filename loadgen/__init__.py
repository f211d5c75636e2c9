"""voicert load generator: simulated callers streaming real speech over the native protocol."""
