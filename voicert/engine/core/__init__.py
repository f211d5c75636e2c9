"""The engine's core floor: one request's state (``sequence``), the paged, prefix-cached KV
bookkeeping (``kv_cache``), continuous batching (``scheduler``, ``spec_policy``), prompts and tool
grammars (``prompt``, ``tools``, ``guided``), speculation (``speculative``, ``draft``, ``heads``), the
model runner that owns every tensor (``runner``) and the synchronous core that steps them all
(``engine_core``). No threads, no processes, no asyncio: the clients (``engine/clients``) own those.
The bookkeeping modules import no torch (an import-linter contract)."""
