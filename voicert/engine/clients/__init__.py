"""The ways to run an engine behind the :class:`~voicert.core.llm.Engine` interface: in this
process on a thread (``llm_engine``), in a child process (``remote``), on an engine host shared by
front-end workers (``host``), rebuilt when it fails (``supervisor``), one per GPU
(``replicas``), a remote OpenAI-compatible server (``openai_compat``, ``chat_upstream``), or plain
transformers (``simple``). Streams detokenise on the caller's loop (``stream``, ``detok``)."""
