"""The speculation policy on made-up step timings (no model, no clock): it tries both kinds of
decode step at each batch size, then takes the one with more tokens per second, keeps checking
the other, and follows acceptance as it changes."""

import pytest

from voicert.engine.core.spec_policy import SpecMode, SpecPolicy, bucket_of

K = 3


def feed(
    policy: SpecPolicy, batch: int, steps: int, plain_s: float, spec_s: float, gain: float
) -> list[int]:
    """Run ``steps`` decode steps at ``batch`` rows, each as the policy decides, with the given
    step durations and tokens gained per row on a verify step; the drafts of each step."""
    chosen = []
    for _ in range(steps):
        k = policy.drafts(batch)
        chosen.append(k)
        if k:
            policy.observe(batch, k, spec_s, batch, round(gain * batch))
        else:
            policy.observe(batch, 0, plain_s, batch, batch)
    return chosen


def feed_late(
    policy: SpecPolicy, batch: int, steps: int, plain_s: float, spec_s: float, gain: float
) -> list[int]:
    """As :func:`feed`, but each step runs what the policy said one step earlier: on the GPU a
    decode step is launched ahead, before the step in flight has been observed."""
    chosen, planned = [], policy.drafts(batch)
    for _ in range(steps):
        k, planned = planned, policy.drafts(batch)
        chosen.append(k)
        policy.observe(
            batch, k, spec_s if k else plain_s, batch, round(gain * batch) if k else batch
        )
    return chosen


def test_batches_share_a_power_of_two_bucket():
    assert [bucket_of(b) for b in (1, 2, 3, 4, 5, 33, 64)] == [1, 2, 4, 4, 8, 64, 64]


def test_it_speculates_where_a_verify_step_is_cheap_and_not_where_it_is_dear():
    policy = SpecPolicy(K, warm=3, probe_every=100, probe_len=4)
    # batch 1: weight-bound, a verify step costs 1.2 plain ones and gains 2.5 tokens
    small = feed(policy, 1, 200, plain_s=1e-3, spec_s=1.2e-3, gain=2.5)
    # batch 64: compute-bound, a verify step costs 3.5 plain ones; acceptance is the same text's
    large = feed(policy, 64, 200, plain_s=2e-3, spec_s=7e-3, gain=2.5)
    # both kinds tried first: three timed steps each (the first of a kind after a switch is not)
    assert small[:8] == [K] * 4 + [0] * 4 and large[:8] == [K] * 4 + [0] * 4
    assert small[8:].count(K) > 0.9 * 192  # then mostly verify steps...
    assert large[8:].count(0) > 0.9 * 192  # ...or mostly plain ones
    # the other kind far behind on both (2.1x, 1.4x): a run of probe_len steps every
    # 4 x probe_every steps
    assert small[8:].count(0) == 0 and large[8:].count(K) == 0
    assert feed(policy, 1, 400, plain_s=1e-3, spec_s=1.2e-3, gain=2.5).count(0) == 4
    assert feed(policy, 64, 400, plain_s=2e-3, spec_s=7e-3, gain=2.5).count(K) == 4
    table = {row.bucket: row for row in policy.table()}
    assert table[1].speculate and not table[64].speculate
    assert table[64].spec_ms == pytest.approx(7.0) and table[64].plain_ms == pytest.approx(2.0)


def test_where_the_kinds_are_close_the_other_is_tried_every_probe_every_steps():
    policy = SpecPolicy(K, warm=3, probe_every=100, probe_len=4)
    chosen = "".join(
        str(int(k > 0)) for k in feed(policy, 2, 408, plain_s=1e-3, spec_s=1.2e-3, gain=1.4)
    )
    assert chosen[8:].count("0000") == 3 and chosen[8:].count("0") == 12  # at 100, 204, 308


def test_falling_acceptance_turns_speculation_off_and_rising_turns_it_back_on():
    policy = SpecPolicy(K, warm=3, probe_every=20, probe_len=3)
    assert feed(policy, 4, 60, plain_s=1e-3, spec_s=1.5e-3, gain=2.5)[-20:].count(K) >= 17
    # the text changes: drafts stop matching (1.1 tokens a verify step < 1.5 plain steps' time)
    assert feed(policy, 4, 80, plain_s=1e-3, spec_s=1.5e-3, gain=1.1)[-20:].count(0) >= 17
    # and matches again: the verify steps it still tries now and then measure it, and it wins
    assert feed(policy, 4, 120, plain_s=1e-3, spec_s=1.5e-3, gain=2.8)[-20:].count(K) >= 17


def test_always_mode_and_no_drafts_decide_nothing():
    always = SpecPolicy(K, SpecMode.ALWAYS)
    assert set(feed(always, 64, 50, plain_s=1e-3, spec_s=9e-3, gain=1.0)) == {K}
    off = SpecPolicy(0)
    assert set(feed(off, 1, 10, plain_s=1e-3, spec_s=1e-3, gain=1.0)) == {0}
    assert off.table() == []


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        SpecPolicy(-1)
    with pytest.raises(ValueError):
        SpecPolicy(2, alpha=0.0)
    with pytest.raises(ValueError):
        SpecPolicy(2, probe_len=1)


def test_the_first_step_of_a_kind_after_a_switch_is_not_timed():
    """It ran without the overlap a step launched ahead has (its predecessor had another width):
    that is the price of switching, not of the kind."""
    policy = SpecPolicy(K, warm=2)
    for seconds in (5e-3, 1e-3, 1e-3):
        policy.observe(8, K, seconds, 8, 16)
    for seconds in (5e-3, 2e-3, 2e-3):
        policy.observe(8, 0, seconds, 8, 8)
    row = policy.table()[0]
    assert (row.bucket, row.spec_ms, row.plain_ms) == (8, pytest.approx(1.0), pytest.approx(2.0))


def test_one_slow_step_does_not_decide():
    """The first verify step at a batch size may include a warm-up (a new shape traced): the
    low quantile of recent steps ignores it."""
    policy = SpecPolicy(K, warm=3, probe_every=50)
    policy.observe(1, K, 1.0, 1, 3)  # a one-off: a second
    assert feed(policy, 1, 100, plain_s=1e-3, spec_s=1.2e-3, gain=2.5)[-20:].count(K) >= 19


def test_a_slow_warm_up_is_outweighed_by_the_next_probe():
    """The first verify steps at a batch size ran slowly (a graph's first replays): plain wins
    at first, and the next run of verify steps, at their real cost, turns it round (it comes
    after 4 x probe_every steps: the warm-up made verify steps look far behind)."""
    policy = SpecPolicy(K, warm=3, probe_every=20, probe_len=4)
    feed(policy, 4, 4, plain_s=1e-3, spec_s=5e-3, gain=2.0)  # the warm-up's verify steps
    first = feed(policy, 4, 20, plain_s=1e-3, spec_s=1.1e-3, gain=2.0)
    later = feed(policy, 4, 100, plain_s=1e-3, spec_s=1.1e-3, gain=2.0)
    assert first.count(0) > 15 and later[-20:].count(K) >= 16


@pytest.mark.parametrize("spec_s, winner", [(1.05e-3, K), (2.5e-3, 0)])
def test_steps_planned_a_step_late_neither_start_probes_nor_lock_the_choice(spec_s, winner):
    """A step launched ahead runs the decision of the step before: after a probe the first step
    is still the probe's kind. It must not count as a new probe (it once did, and with the GPU's
    overlap a bucket where verify steps won ran plain steps only)."""
    policy = SpecPolicy(K, warm=3, probe_every=100, probe_len=4)
    chosen = feed_late(policy, 1, 400, plain_s=1e-3, spec_s=spec_s, gain=1.6)
    assert chosen[20:].count(winner) > 0.9 * 380


def test_a_waiting_prompt_gets_plain_steps_and_then_speculation_resumes():
    policy = SpecPolicy(K)
    feed(policy, 1, 20, plain_s=1e-3, spec_s=1.1e-3, gain=2.5)  # verify steps win at batch 1
    assert policy.drafts(1) == K and policy.drafts(1, prompts_waiting=True) == 0
    policy.observe(1, 0, 1e-3, 1, 1)  # the plain step run while the prompt waited
    assert policy.drafts(1) == K  # no probe started, the choice stands
    always = SpecPolicy(K, SpecMode.ALWAYS)
    assert always.drafts(1, prompts_waiting=True) == K  # always: every step that can
