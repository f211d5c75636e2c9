from voicert.speech.sentences import SentenceSplitter


def feed(text: str, step: int = 3, **kw) -> list[str]:
    """Push ``text`` in small deltas, as tokens arrive, then flush."""
    s = SentenceSplitter(**kw)
    out = []
    for i in range(0, len(text), step):
        out += s.push(text[i : i + step])
    return out + s.flush()


def test_sentences_cut_as_soon_as_the_next_word_starts():
    s = SentenceSplitter()
    assert s.push("The capital of France is Paris.") == []  # could still be "Paris.com"
    assert s.push(" It") == ["The capital of France is Paris."]
    assert s.flush() == ["It"]


def test_abbreviations_initials_and_decimals_do_not_end_a_sentence():
    text = "Dr. Smith met J. Doe at 3.5 p.m. on Main St. today. Then they left!"
    assert feed(text) == ["Dr. Smith met J. Doe at 3.5 p.m. on Main St. today.", "Then they left!"]


def test_question_exclamation_quotes_and_newlines():
    assert feed('He said "yes." Really?! Sure\nNext line') == [
        'He said "yes."',
        "Really?!",
        "Sure",
        "Next line",
    ]


def test_first_piece_may_end_at_a_clause_break_later_ones_wait_for_sentences():
    text = "Sure, I can book a table for two, at seven, tomorrow evening. Anything else, or is that all?"
    assert feed(text, first_clause_chars=24) == [
        "Sure, I can book a table for two,",
        "at seven, tomorrow evening.",
        "Anything else, or is that all?",
    ]


def test_nothing_empty_and_text_is_preserved():
    text = "  One.   Two!  \n\n Three  "
    out = feed(text, step=1)
    assert out == ["One.", "Two!", "Three"]
    assert all(out)


def test_a_first_piece_may_end_after_n_words_when_no_break_comes_and_only_the_first():
    text = "The capital of France is Paris and its river is the Seine. It flows through the city."
    assert feed(text, first_piece_words=4) == [
        "The capital of France",
        "is Paris and its river is the Seine.",
        "It flows through the city.",
    ]
    # a sentence or clause break before the Nth word still ends it there
    assert feed("Yes. The table is booked for you now.", first_piece_words=4) == [
        "Yes.",
        "The table is booked for you now.",
    ]
    assert feed(
        "Sure, I have booked a table for four at seven thirty tonight.",
        first_piece_words=6,
        first_clause_chars=4,
    ) == ["Sure,", "I have booked a table for four at seven thirty tonight."]
    # off by default: the first piece waits for a break
    assert feed(text) == [
        "The capital of France is Paris and its river is the Seine.",
        "It flows through the city.",
    ]
