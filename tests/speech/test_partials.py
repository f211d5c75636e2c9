from voicert.speech.partials import LocalAgreement


def test_words_become_stable_when_two_decodes_agree():
    la = LocalAgreement()
    assert la.update("What is") == ("", "What is")
    assert la.update("What is the cap") == ("What is", "the cap")
    assert la.update("What is the capital of") == ("What is the", "capital of")
    assert la.update("What is the capital of France?") == ("What is the capital of", "France?")


def test_agreement_ignores_case_and_punctuation():
    la = LocalAgreement()
    la.update("hello, world")
    assert la.update("Hello world again") == ("Hello world", "again")


def test_stable_text_never_shrinks_even_if_whisper_revises():
    la = LocalAgreement()
    la.update("the cat sat")
    la.update("the cat sat on")
    assert la.stable == ["the", "cat", "sat"]
    stable, _unstable = la.update("a cat sat on the mat")
    assert stable.startswith("the cat sat")


def test_disagreement_commits_nothing():
    la = LocalAgreement()
    la.update("one two")
    assert la.update("three four") == ("", "three four")
