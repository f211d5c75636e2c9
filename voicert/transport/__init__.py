"""What the doors share below the protocol: telephony playback (marks, clear) for every provider."""
