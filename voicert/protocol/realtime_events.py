"""The Realtime API's server events as typed structs (msgspec), one per event this server sends.

Each struct's tag is the event's GA name; :class:`~voicert.protocol.realtime.EventWriter` gives
it a fresh ``event_id`` and, on a beta connection, the beta name. Items, responses, content parts
and sessions ride inside as the maps ``protocol/realtime.py`` builds (their shapes differ by flavour
and by item type). Sans-I/O: nothing here sends.
"""

from __future__ import annotations

from typing import Any

import msgspec

Wire = dict[str, Any]  # an item, a response, a content part or a session, as sent


class ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    """Every server event: the writer sets ``event_id`` as it encodes."""

    event_id: str = ""


# ---------------------------------------------------------------- session, errors


class SessionCreated(ServerEvent, tag="session.created"):
    session: Wire


class SessionUpdated(ServerEvent, tag="session.updated"):
    session: Wire


class Error(ServerEvent, tag="error"):
    error: Wire  # type, code, message, param, event_id (the client event it answers)


# ---------------------------------------------------------------- the input audio buffer


class AudioCleared(ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class AudioCommitted(ServerEvent, tag="input_audio_buffer.committed"):
    previous_item_id: str | None
    item_id: str


class SpeechStarted(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


# ---------------------------------------------------------------- the conversation


class ItemAdded(ServerEvent, tag="conversation.item.added"):
    previous_item_id: str | None
    item: Wire


class ItemDone(ServerEvent, tag="conversation.item.done"):
    previous_item_id: str | None
    item: Wire


class ItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: Wire


class ItemDeleted(ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class ItemTruncated(ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class TranscriptionCompleted(
    ServerEvent, tag="conversation.item.input_audio_transcription.completed"
):
    item_id: str
    content_index: int
    transcript: str
    usage: Wire


class TranscriptionDelta(ServerEvent, tag="conversation.item.input_audio_transcription.delta"):
    item_id: str
    content_index: int
    delta: str


# ---------------------------------------------------------------- responses


class ResponseCreated(ServerEvent, tag="response.created"):
    response: Wire


class ResponseDone(ServerEvent, tag="response.done"):
    response: Wire


class OutputItemAdded(ServerEvent, tag="response.output_item.added"):
    response_id: str
    output_index: int
    item: Wire


class OutputItemDone(ServerEvent, tag="response.output_item.done"):
    response_id: str
    output_index: int
    item: Wire


class _Part(ServerEvent):
    """An event about one content part of a response's message item."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ContentPartAdded(_Part, tag="response.content_part.added"):
    part: Wire


class ContentPartDone(_Part, tag="response.content_part.done"):
    part: Wire


class TextDelta(_Part, tag="response.output_text.delta"):
    delta: str


class TextDone(_Part, tag="response.output_text.done"):
    text: str


class AudioTranscriptDelta(_Part, tag="response.output_audio_transcript.delta"):
    delta: str


class AudioTranscriptDone(_Part, tag="response.output_audio_transcript.done"):
    transcript: str


class AudioDelta(_Part, tag="response.output_audio.delta"):
    delta: str  # base64 audio in the session's output format


class AudioDone(_Part, tag="response.output_audio.done"):
    pass


class _Call(ServerEvent):
    """An event about a function_call item of a response."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str


class ArgumentsDelta(_Call, tag="response.function_call_arguments.delta"):
    delta: str


class ArgumentsDone(_Call, tag="response.function_call_arguments.done"):
    name: str
    arguments: str
