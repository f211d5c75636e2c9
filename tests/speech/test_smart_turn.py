"""The smart-turn v3 model from the pipecat-ai wheel: its input features equal the reference
implementation the wheel ships, batched scores equal one-at-a-time, and a missing wheel is a
config error that says how to install it."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import numpy as np
import pytest

from tests.conftest import wav
from voicert.config import ConfigError
from voicert.speech import smart_turn
from voicert.speech.smart_turn import SmartTurn, features, mel_extractor


def _reference():
    dist = importlib.metadata.distribution("pipecat-ai")
    path = dist.locate_file("pipecat/audio/turn/smart_turn/_whisper_features.py")
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_whisper_log_mel_features


@pytest.fixture(scope="module")
def model():
    return SmartTurn()


def test_features_equal_the_reference_shipped_with_the_model():
    reference = _reference()
    x, _ = wav("capital_of_france")
    for audio in (x, np.tile(x, 5)):  # shorter than the 8 s window, and longer
        window = audio[-smart_turn.N_SAMPLES :]
        padded = np.pad(window, (smart_turn.N_SAMPLES - window.size, 0))
        np.testing.assert_allclose(features(audio, mel_extractor()), reference(padded), atol=1e-4)


def test_a_batch_scores_as_each_utterance_alone(model):
    a, _ = wav("capital_of_france")
    b, _ = wav("tell_me_a_joke")
    together = model.score([a, b, a[:8000]])
    alone = np.concatenate([model.score([a]), model.score([b]), model.score([a[:8000]])])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert together.shape == (3,) and ((together >= 0) & (together <= 1)).all()


def test_a_missing_wheel_is_a_config_error_naming_the_key(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(
        ConfigError, match=r"turn\.model=smart_turn.*pip install --no-deps pipecat-ai"
    ):
        smart_turn.model_path()


def test_a_model_path_that_is_not_a_file_is_a_config_error_naming_the_key(tmp_path):
    import dataclasses

    from voicert.config import Config, TurnConfig
    from voicert.server.app import load_turn_judge

    cfg = dataclasses.replace(
        Config(), turn=TurnConfig(detector="semantic", model_path=str(tmp_path / "nope.onnx"))
    )
    with pytest.raises(ConfigError, match=r"turn\.model_path: .*nope\.onnx is not a file"):
        load_turn_judge(cfg)


def _head(graph: str, seed: int = 0) -> smart_turn.PauseHead:
    rng = np.random.default_rng(seed)
    return smart_turn.PauseHead(rng.normal(0, 0.05, 768), 0.1, graph, {"data": "a test's"})


def test_the_pause_head_reads_the_same_forward_pass_as_smart_turns_own_score(model, tmp_path):
    a, _ = wav("capital_of_france")
    b, _ = wav("tell_me_a_joke")
    head = _head(smart_turn.graph_digest(model.path))
    with_head = SmartTurn(model.path, head=head)
    own, by_head = with_head.score_both([a, b])
    np.testing.assert_allclose(own, model.score([a, b]), atol=1e-6)  # smart-turn's own, unchanged
    got = with_head.opinions([a, b])
    assert [o.complete for o in got] == pytest.approx(list(own))
    assert [o.pause for o in got] == pytest.approx(list(by_head))
    assert all(o.pause is None for o in model.opinions([a, b]))  # no head, no second opinion
    # the head's figure by hand: its logistic on the graph's pooled state and its last frames
    names = [smart_turn.LOGITS, smart_turn.POOLED, smart_turn.FRAMES]
    batch = np.stack([features(u, mel_extractor()) for u in (a, b)])
    _, pooled, frames = smart_turn._onnx_graph(model.path, 1, names)(batch)
    x = np.concatenate([pooled, frames[:, -12:].mean(1)], axis=1)
    want = 1 / (1 + np.exp(-(x @ head.weight + head.bias)))
    np.testing.assert_allclose(by_head, want, rtol=1e-5)


def test_a_pause_head_survives_its_file(tmp_path):
    head = _head("abc")
    head.save(tmp_path / "h.json")
    back = smart_turn.PauseHead.load(tmp_path / "h.json")
    np.testing.assert_array_equal(back.weight, head.weight)
    assert (back.bias, back.graph, back.meta) == (head.bias, "abc", head.meta)


def test_a_pause_head_for_another_graph_is_refused_naming_the_key_or_left_out_by_auto(
    model, tmp_path, monkeypatch
):
    _head("not this graph").save(tmp_path / "other.json")
    with pytest.raises(ConfigError, match=r"turn\.audio_head: .*another smart-turn graph"):
        smart_turn.pause_head(str(tmp_path / "other.json"), model.path)
    monkeypatch.setattr(smart_turn, "EMBEDDED_PAUSE_HEAD", tmp_path / "other.json")
    assert smart_turn.pause_head("auto", model.path) is None
    assert smart_turn.pause_head("none", model.path) is None
    with pytest.raises(ConfigError, match=r"turn\.audio_head: .*nope\.json is not a file"):
        smart_turn.pause_head(str(tmp_path / "nope.json"), model.path)


def test_the_shipped_pause_head_fits_the_wheels_smart_turn(model):
    head = smart_turn.pause_head("auto", model.path)
    assert head is not None and head.weight.shape == (768,)


class _Counting:
    """Stands in for the model: records each call's batch; ``gate`` holds calls until set;
    ``entered`` is set once a call has begun."""

    def __init__(self) -> None:
        import threading

        self.batches: list[int] = []
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def opinions(self, utterances):
        from voicert.core.speech import TurnAudio

        self.entered.set()
        assert self.gate.wait(120), "the test never opened the gate"
        self.batches.append(len(utterances))
        return [TurnAudio(float(u[0]), float(u[0]) / 2) for u in utterances]


async def test_judgements_asked_for_together_go_in_one_call_each_with_its_own_answer():
    import asyncio

    from voicert.speech.smart_turn import TurnJudge

    fake = _Counting()
    judge = TurnJudge(fake, concurrency=1)  # type: ignore[arg-type]
    try:
        probs = await asyncio.gather(
            *(judge.score(np.full(10, i / 10, np.float32)) for i in range(5))
        )
        assert [p.complete for p in probs] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
        assert [p.pause for p in probs] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
        assert fake.batches == [5]
    finally:
        judge.close()


async def test_judgements_that_arrive_during_a_call_go_together_in_the_next():
    import asyncio

    from voicert.speech.smart_turn import TurnJudge

    fake = _Counting()
    judge = TurnJudge(fake, concurrency=1, max_batch=3)  # type: ignore[arg-type]
    try:
        fake.gate.clear()  # the first call holds
        first = asyncio.ensure_future(judge.score(np.zeros(10, np.float32)))
        assert await asyncio.to_thread(fake.entered.wait, 120)  # the first call is running
        later = [asyncio.ensure_future(judge.score(np.ones(10, np.float32))) for _ in range(4)]
        await asyncio.sleep(0)  # each later judgement is asked for, and waits
        assert judge.calls == 1 and not any(f.done() for f in later)
        fake.gate.set()
        await asyncio.gather(first, *later)
        assert fake.batches == [1, 3, 1]  # then at most max_batch a call
        assert judge.calls == 3 and judge.judged == 5
    finally:
        judge.close()
