"""The live turn-taking bench runs each mode with the bench's own turn settings: ``--set turn.*``
reaches every mode's server, and only the detector, audio model and word cue are the mode's."""

import dataclasses

from voicert.bench.turns import MODES, mode_config
from voicert.config import Config


def test_each_mode_keeps_the_turn_settings_it_was_given():
    cfg = Config()
    cfg = dataclasses.replace(
        cfg, turn=dataclasses.replace(cfg.turn, patience=2.5, preempt=False, pause_ms=128)
    )
    for mode, want in MODES.items():
        turn = mode_config(cfg, mode).turn
        assert (turn.patience, turn.preempt, turn.pause_ms) == (2.5, False, 128), mode
        assert (turn.detector, turn.model, turn.text_cue) == (
            want.detector,
            want.model,
            want.text_cue,
        )
    assert mode_config(cfg, "hazard").server.port == 0
