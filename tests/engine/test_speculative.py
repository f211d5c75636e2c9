from voicert.engine.core.speculative import accept_greedy, ngram_propose


def test_ngram_proposes_what_followed_the_last_occurrence():
    toks = [5, 1, 2, 3, 9, 9, 1, 2, 3]
    assert ngram_propose(toks, 3) == [9, 9, 1]


def test_ngram_prefers_longer_matches_and_recent_ones():
    toks = [1, 2, 7, 0, 3, 2, 8, 0, 1, 2]
    assert ngram_propose(toks, 1) == [7]  # "1 2" matched, not just "2"
    assert ngram_propose([4, 2, 5, 2, 6, 2], 2) == [6, 2]  # the most recent "2" with a follower


def test_ngram_no_match():
    assert ngram_propose([1, 2, 3], 4) == []
    assert ngram_propose([1], 4) == []
    assert ngram_propose([1, 2, 1], 0) == []


def test_accept_greedy_keeps_agreeing_prefix_plus_target_token():
    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]
    assert accept_greedy([4, 5, 6], [4, 5, 6, 1]) == [4, 5, 6, 1]
    assert accept_greedy([4, 5, 6], [7, 5, 6, 1]) == [7]
