"""Grammar-constrained greedy decoding: each guided sequence's next token is the argmax over the
tokens its grammar allows (llguidance computes the allowed set as a bitmask).

The mask is computed only when it matters: the step picks the plain greedy token for every row
first; a guided row whose token the grammar accepts keeps it (the argmax over all tokens, when
allowed, is the argmax over the allowed ones: the same token as the masked argmax, ties included).
Only when it is refused is the row's full mask computed and applied to its logits. So an
unconstrained sequence's tokens never change, whatever else shares its batch, and the mask costs
nothing on the steps where the model already agrees with the grammar.

A :class:`Guide` is not thread-safe: the thread that steps its sequence owns it. :class:`Guides`
is: a request's grammar may be compiled on another thread (``EngineThread`` does it on its
grammar thread), and each tool set's compiled grammar is kept (:data:`CACHED_GRAMMARS`), so a
request only copies it.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading

import numpy as np
import torch

from voicert.core.llm import GenerationRequest
from voicert.engine.core.tools import call_grammar

log = logging.getLogger(__name__)


PROBE = '<tool_call>\n{"name": "book", "arguments": {"n": 4, "é": "ü"}}\n</tool_call> ok.'


def round_trips(ll, tokenizer) -> bool:
    """llguidance decodes the tokenizer's ids of a probe text to the bytes the tokenizer does."""
    ids = tokenizer.encode(PROBE, add_special_tokens=False)
    want = tokenizer.decode(ids, clean_up_tokenization_spaces=False).encode()
    return ll.decode_bytes(ids) == want


class TokenBytes:
    """A tokenizer as llguidance.TokenizerWrapper takes it: each id's bytes (byte-level BPE
    pieces mapped back through GPT-2's byte table, SentencePiece pieces with their spaces and
    <0xNN> byte tokens), the special ids, and encoding."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        special = set(tokenizer.all_special_ids) | set(
            getattr(tokenizer, "added_tokens_decoder", {}) or ()
        )
        pieces = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), vocab_size))))
        self.tokens = [_piece_bytes(p, i in special, byte_of) for i, p in enumerate(pieces)]
        self.tokens += [b""] * (vocab_size - len(self.tokens))  # the model's padding ids
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = sorted(special)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)


def _piece_bytes(piece: str | None, special: bool, byte_of: dict[str, int]) -> bytes:
    if piece is None:
        return b""
    if special:
        return piece.encode()
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    if all(c in byte_of for c in piece):
        return bytes(byte_of[c] for c in piece)
    return piece.replace("\u2581", " ").encode()


# llguidance's work per grammar: its lexer's fuel caps how much one request's regexes may build
# (a pattern like ^((a{100}){100}){100}$ took ~1 s and ~250 MB of the engine thread at the
# default 1,000,000; at this, ~40 ms and an error for that request alone). A 400-pattern
# schema and the formats (date-time, email) fit in it.
LEXER_FUEL = 100_000


def limits():
    import llguidance

    # verbose errors would put the parser state and the client's schema in the logs
    return llguidance.LLParserLimits(initial_lexer_fuel=LEXER_FUEL, verbose_errors=False)


class GuideError(ValueError):
    """A request's grammar could not be compiled (a schema llguidance does not take)."""


class Guide:
    """One sequence's grammar state. Contract: for each token the sequence gets, call
    :meth:`pick` (which may replace a refused greedy token) and then :meth:`advance` with the
    token kept. ``finished`` once the grammar allows nothing but the end of the reply."""

    def __init__(self, matcher, vocab_size: int, on_limit=None) -> None:
        """``on_limit(error)``: called when the grammar's lexer goes over its limits (the
        tool set is then refused for good: :class:`Guides` keeps it so)."""
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.masked_steps = 0  # steps whose greedy token the grammar refused
        self.on_limit = on_limit

    def allows(self, token: int) -> bool:
        return self.matcher.validate_tokens([token]) == 1

    def allowed(self, device: torch.device | str) -> torch.Tensor:
        """The tokens the grammar allows next: bool [V] on ``device``."""
        words = -(-self.vocab_size // 32)
        packed = np.empty((1, words), dtype=np.int32)  # [1, W]
        self.matcher.unsafe_compute_mask_ptr(packed[0].ctypes.data, words * 4)
        self.masked_steps += 1
        return unpack_allowed(torch.from_numpy(packed).to(device), self.vocab_size)[0]

    def pick(self, token: int, logits: torch.Tensor | None) -> int:
        """The token to keep: ``token`` (the greedy pick over all tokens) when the grammar allows
        it, else the argmax of ``logits`` ([V] float, on any device) over the allowed tokens.
        ``logits`` is only read in the second case; it may be a callable returning them."""
        if self.allows(token):
            return token
        row = logits() if callable(logits) else logits  # [V]
        if row is None:
            raise ValueError("the grammar refuses the greedy token and no logits were given")
        return masked_argmax([self], row.unsqueeze(0))[0]

    def advance(self, token: int) -> None:
        if self.matcher.is_error() or not self.matcher.consume_token(token):
            first = (self.matcher.get_error().splitlines() or [""])[0]
            if "lexer error" in first:  # its regexes went over the limits (a hostile pattern)
                error = GuideError(f"tool schema beyond the engine's limits ({_short(first)})")
                if self.on_limit is not None:
                    self.on_limit(error)
                raise error
            raise GuideError(f"the grammar refused token {token}: {first}")

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()


def unpack_allowed(packed: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's bitmask, int32 [R, ceil(V / 32)] (bit j of word w: token 32 w + j) -> bool
    [R, V], on the mask's device. Plain torch ops: llguidance.torch's kernel is torch.compile'd
    (~20 s to build on first use)."""
    shifts = torch.arange(32, dtype=torch.int32, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # [R, W, 32] (an arithmetic shift keeps bit j)
    return bits.view(packed.shape[0], -1)[:, :vocab].bool()


def masked_argmax(guides: list[Guide], logits: torch.Tensor, executor=None) -> list[int]:
    """logits [R, >= V] (any device): for each row, the best token its guide's grammar allows.
    The masks are computed on the host (~10 us a row; on ``executor``'s threads, an
    llguidance.LLExecutor, when given and there are several rows) and applied in one batch: one
    copy, one masked argmax, one sync, however many rows."""
    vocab = guides[0].vocab_size
    words = -(-vocab // 32)
    packed = np.empty((len(guides), words), dtype=np.int32)  # [R, W]
    if executor is not None and len(guides) >= PARALLEL_ROWS:
        executor.unsafe_compute_mask_ptr(
            [(g.matcher, i) for i, g in enumerate(guides)],
            packed.ctypes.data,
            words * 4,
            len(guides),
        )
    else:
        for i, guide in enumerate(guides):
            guide.matcher.unsafe_compute_mask_ptr(packed[i].ctypes.data, words * 4)
    for guide in guides:
        guide.masked_steps += 1
    allowed = unpack_allowed(torch.from_numpy(packed).to(logits.device), vocab)  # bool [R, V]
    best = logits[:, :vocab].float().masked_fill(~allowed, float("-inf")).argmax(-1)  # [R]
    return best.tolist()


PARALLEL_ROWS = 8  # refused rows from which their masks are computed on several threads


CACHED_GRAMMARS = 64  # tool sets whose compiled grammar (or refusal) is kept, least recent out
ERROR_CHARS = 300  # of llguidance's message in a refusal (its later lines quote the grammar)


def _short(error: str) -> str:
    first = (error.strip().splitlines() or [""])[0]
    return first if len(first) <= ERROR_CHARS else first[: ERROR_CHARS - 3] + "..."


class Guides:
    """Builds a :class:`Guide` for each request that needs one; thread-safe. The llguidance
    tokenizer is made once, on first use (~0.6 s for a 49k vocabulary). A tool set's grammar is
    compiled once (~30 ms for 64 tools, ~60 ms for 128, on one core) and kept with the last
    :data:`CACHED_GRAMMARS` others; a request gets a copy (~0.01-1 ms). A grammar llguidance
    refuses is kept as refused: a client that repeats it costs nothing more."""

    def __init__(self, tokenizer, vocab_size: int, call_format) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.call_format = call_format
        self._ll = None
        self._lock = threading.Lock()  # the tokenizer's making and the cache
        self._compiled: collections.OrderedDict[str, object] = collections.OrderedDict()
        self.compiles = 0  # grammars compiled (not served from the cache)
        self.executor = None  # llguidance's thread pool: masks of many rows at once
        if (os.cpu_count() or 1) >= 8:  # on two cores its threads cost more than they save
            import llguidance

            self.executor = llguidance.LLExecutor()

    def warm(self) -> None:
        """Make llguidance's view of the tokenizer now, at start: ~0.45 s on 2 cores for SmolLM2's,
        holding the GIL, which the first request with tools would otherwise stall every caller
        for. A tokenizer it cannot read is logged here; requests with tools are refused then."""
        try:
            self._ll_tokenizer()
        except GuideError as exc:
            log.warning("guided decoding: %s", exc)

    def _ll_tokenizer(self):
        """llguidance's view of the tokenizer, made on first use."""
        with self._lock:
            if self._ll is None:
                self._ll = self._make_ll_tokenizer()
            return self._ll

    def _make_ll_tokenizer(self):
        """From the tokenizer's tokenizer.json, checked against the tokenizer itself; when the
        two disagree (seen: a GGUF-converted tokenizer under another transformers version, whose
        JSON llguidance read as text, not byte-level BPE), from each token's bytes instead.
        Raises GuideError when neither reads the tokens right."""
        import llguidance
        import llguidance.hf

        ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
        if round_trips(ll, self.tokenizer):
            return ll
        log.warning(
            "guided decoding: llguidance misread tokenizer.json; reading the tokens' bytes instead"
        )
        ll = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(TokenBytes(self.tokenizer, self.vocab_size)),
            n_vocab=self.vocab_size,
        )
        if not round_trips(ll, self.tokenizer):
            raise GuideError(
                "this tokenizer's tokens cannot be read as bytes: tool "
                "calls cannot be decoded under their schemas"
            )
        return ll

    def grammar(self, request: GenerationRequest) -> str | None:
        """The Lark grammar ``request`` is decoded under, or None."""
        if not request.tools:
            return None
        return call_grammar(
            request.tools, request.tool_choice, self.call_format, request.parallel_tool_calls
        )

    def for_request(self, request: GenerationRequest) -> Guide | None:
        """The request's guide (None: it has no tools). Raises GuideError for a grammar
        llguidance cannot compile (its message's first line, cut to :data:`ERROR_CHARS`)."""
        lark = self.grammar(request)
        if lark is None:
            return None
        compiled = self._template(lark)
        if isinstance(compiled, GuideError):
            raise compiled
        return Guide(compiled.deep_copy(), self.vocab_size, functools.partial(self._refuse, lark))

    def _refuse(self, lark: str, error: GuideError) -> None:
        """A request under ``lark`` went over the lexer's limits: later requests with the same
        tools are refused when their guide is built (the copies share the lexer's states, so each
        would otherwise build a little more of a hostile pattern's, and keep it)."""
        with self._lock:
            self._compiled[lark] = error

    def _template(self, lark: str):
        """The compiled matcher of ``lark`` (never advanced: requests copy it), or the
        GuideError it was refused with; from the cache when it holds it."""
        with self._lock:
            hit = self._compiled.get(lark)
            if hit is not None:
                self._compiled.move_to_end(lark)
                return hit
        compiled = self._compile(lark)  # outside the lock: another tool set need not wait
        with self._lock:
            self.compiles += 1
            self._compiled[lark] = compiled
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return compiled

    def _compile(self, lark: str):
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        except Exception as exc:
            return GuideError(f"tool schema not usable: {_short(str(exc))}")
        matcher = llguidance.LLMatcher(self._ll_tokenizer(), grammar, limits=limits())
        if matcher.is_error():
            return GuideError(f"tool schema not usable: {_short(matcher.get_error())}")
        return matcher
