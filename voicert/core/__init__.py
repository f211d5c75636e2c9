"""The core's own types: what a session tells its door, independent of any wire protocol."""
