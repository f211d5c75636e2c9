"""The conversation: typed items with ids, bounded by count and characters (oldest first), text
over the limit refused, assistant items truncated to what was heard, items deleted."""

import pytest

from voicert.agent.conversation import Conversation, Role, TextTooLong


def test_items_get_ids_and_become_chat_messages_in_order():
    c = Conversation()
    a = c.add(Role.USER, "Hello")
    b = c.add("assistant", "Hi there", item_id="item_x")
    assert a.item_id != b.item_id and b.item_id == "item_x"
    assert [(m.role, m.content) for m in c.messages()] == [
        ("user", "Hello"),
        ("assistant", "Hi there"),
    ]


def test_the_oldest_items_go_past_the_item_and_character_bounds():
    c = Conversation(max_items=3, max_text_chars=100, max_chars=250)
    for i in range(5):
        c.add(Role.USER, f"message {i}")
    assert [m.content for m in c.messages()] == ["message 2", "message 3", "message 4"]
    assert c.dropped == 2
    c.add(Role.USER, "x" * 100)
    c.add(Role.USER, "y" * 100)
    c.add(Role.USER, "z" * 100)  # 300 characters with the two before: the oldest goes
    assert [m.content[0] for m in c.messages()] == ["y", "z"] and c.chars == 200


def test_text_over_the_limit_is_refused_and_nothing_is_added():
    c = Conversation(max_text_chars=10)
    with pytest.raises(TextTooLong):
        c.add(Role.USER, "x" * 11)
    assert len(c) == 0


def test_an_assistant_item_is_truncated_to_what_was_heard():
    c = Conversation()
    c.add(Role.USER, "Count to ten.")
    reply = c.add(Role.ASSISTANT, "One, two, three, four, five.")
    cut = c.truncate(reply.item_id, 9)
    assert cut.text == "One, two," and c.messages()[-1].content == "One, two,"
    assert c.chars == len("Count to ten.") + 9
    with pytest.raises(ValueError):
        c.truncate(next(iter(c)).item_id, 3)  # a user item
    with pytest.raises(KeyError):
        c.truncate("item_nope", 3)


def test_an_item_is_deleted():
    c = Conversation()
    first = c.add(Role.USER, "Hello")
    c.add(Role.USER, "Again")
    c.delete(first.item_id)
    assert [m.content for m in c.messages()] == ["Again"] and c.chars == 5
    with pytest.raises(KeyError):
        c.delete(first.item_id)
