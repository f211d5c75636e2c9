"""eot-bench's figures from scored pauses (bench/eot.py), on hand-made signals: no models."""

import numpy as np
import pytest

from voicert.bench.eot import Detector, Pause, Scored, evaluate, figures, find_pauses


def rendering(inner: list[float], final_ms: float = 2000) -> Scored:
    s = Scored("x", "pause", "c", "v", "clean", "w")
    s.pauses = [Pause(100.0 * i, ms, False) for i, ms in enumerate(inner)]
    s.pauses.append(Pause(5000, final_ms, True))
    return s


def silence(p: Pause, ms: float) -> float:
    return ms


def test_a_pause_shorter_than_the_wait_is_heard_through_and_a_longer_one_cuts_off():
    scored = [rendering([300]), rendering([900]), rendering([])]
    point = evaluate(scored, silence, 500)
    assert point.cut_off == 0.5  # of the two with inner pauses, the 900 ms one
    # dead air counts only the turns that were not cut off: the other two waited 500 ms
    assert point.dead_mean == 500 and point.dead_p95 == 500


def test_the_figures_pick_the_best_setting_within_each_budget_and_at_the_cut_off_goal():
    scored = [rendering([ms]) for ms in (200, 400, 600, 800, 1000)] + [rendering([])] * 5
    d = Detector("silence", silence, tuple(range(100, 1201, 100)), 400)
    f = figures(scored, d)
    assert f.default.cut_off == 0.6  # 600, 800 and 1000 ms pauses outlast a 400 ms wait
    # the fewest cut-offs within the budget, then the least dead air (a 300 ms wait cuts as many
    # as a 200 ms one: the 200 ms pause is heard through by both)
    assert f.cut_at[300].setting == 200 and f.cut_at[500].setting == 400
    assert f.at_goal is not None and f.at_goal.setting == 1000  # none cut off, least dead air


def test_pauses_are_the_silences_between_voiced_windows_and_the_last_runs_to_the_end():
    probs = np.array([0.1, 0.9, 0.9, 0.2, 0.2, 0.2, 0.9, 0.1, 0.1])
    assert find_pauses(probs, 0.5, 0.35, 9 * 32) == [(96, 96), (224, 64)]


def test_the_hazard_fit_weighs_the_opinion_that_tells_ends_from_pauses():
    from voicert.bench.eot import fit_weights

    rng = np.random.default_rng(0)
    scored = []
    for i in range(60):
        final = i % 2 == 0
        head = rng.uniform(0.6, 0.99) if final else rng.uniform(0.01, 0.4)
        p = Pause(
            0,
            300,
            final,
            audio_prob=rng.uniform(0.1, 0.9),
            text="Yes, and",
            text_prob=rng.uniform(0.01, 0.9),
            turn_prob=head,
        )
        scored.append(Scored(f"s{i}", "k", "c", "v", "clean", "w", pauses=[p]))
    with_head = fit_weights(scored, head=True)
    assert with_head.head > 1 and abs(with_head.audio) < with_head.head
    assert fit_weights(scored, head=False).head == 0.0


def test_saved_signals_are_completed_with_the_items_added_since(monkeypatch):
    from voicert.bench import eot, turn_set

    rendered: list[list[str]] = []

    def fake_render(conditions, items):
        rendered.append([i.id for i in items])
        return [
            turn_set.Rendering(f"{i.id}-piper-{c}", i, "piper:joe@1.0", 300, c, np.zeros(1), 0)
            for i in items
            for c in conditions
        ]

    monkeypatch.setattr(turn_set, "render_set", fake_render)
    have = [
        Scored(f"{i.id}-piper-clean", i.kind, i.category, "piper", "clean", i.text)
        for i in turn_set.ITEMS[:-2]
    ]
    todo = eot._to_render(have, ("clean",), None)
    assert rendered == [[i.id for i in turn_set.ITEMS[-2:]]]
    assert [r.item.id for r in todo] == [i.id for i in turn_set.ITEMS[-2:]]
    assert (
        eot._to_render(
            have + [eot.Scored(r.id, "", "", "", "clean", "") for r in todo], ("clean",), None
        )
        == []
    )


def test_the_second_batch_is_reported_apart_as_held_out():
    from voicert.bench import eot, turn_set

    one, two = turn_set.ITEMS[0], turn_set.ITEMS[-1]
    assert (one.batch, two.batch) == (1, 2)
    scored = [Scored(f"{i.id}-piper-clean", i.kind, "", "", "clean", "") for i in (one, two)]
    assert [s.id for s in eot.held_out(scored)] == [f"{two.id}-piper-clean"]


def test_a_condition_already_scored_is_not_scored_again(monkeypatch):
    from voicert.bench import eot, turn_set

    def fake_render(conditions, items):
        return [
            turn_set.Rendering(f"{i.id}-piper-{c}", i, "piper:joe@1.0", 300, c, np.zeros(1), 0)
            for i in items
            for c in conditions
        ]

    monkeypatch.setattr(turn_set, "render_set", fake_render)
    have = [
        Scored(f"{i.id}-piper-clean", i.kind, i.category, "piper", "clean", i.text)
        for i in turn_set.ITEMS
    ]  # every item heard clean; none noisy yet, and nothing on file
    todo = eot._to_render(have, ("clean", "noisy"), None)
    assert {r.condition for r in todo} == {"noisy"} and len(todo) == len(turn_set.ITEMS)


def test_signals_saved_before_the_pause_head_get_its_opinion_from_their_renderings():
    from voicert.bench import eot, turn_set

    class Model:  # smart-turn's own: the audio's length in s; the head's: half that
        def score_both(self, audios):
            own = np.array([a.size / 16000 for a in audios])
            return own, own / 2

    item = turn_set.ITEMS[0]
    r = turn_set.Rendering(
        f"{item.id}-piper-clean", item, "piper", 300, "clean", np.ones(8000), 8000
    )
    judged, unjudged = Pause(500.0, 400.0, False, audio_prob=0.3), Pause(900.0, 100.0, True)
    s = Scored(r.id, item.kind, item.category, "piper", "clean", "", pauses=[judged, unjudged])
    assert eot.rejudge_audio(Model(), [s], [r], judge_ms=192) == 1
    assert judged.audio_prob == pytest.approx((500 + 192) / 1000)  # the audio up to the judgement
    assert judged.pause_prob == pytest.approx(judged.audio_prob / 2)
    assert unjudged.pause_prob is None  # never judged (too short): stays so
    assert eot.rejudge_audio(Model(), [s], [r], judge_ms=192) == 0  # complete now
