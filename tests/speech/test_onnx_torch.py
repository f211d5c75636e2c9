"""The quantized ONNX graph run by torch (speech/onnx_torch.py): each operator equals ONNX's own
reference implementation on one node, and the whole smart-turn graph agrees with the reference
as closely as onnxruntime itself does (the int8 graph's outputs move with the rounding of any
intermediate value, so no two runtimes are bit-equal on it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.conftest import wav
from voicert.speech import smart_turn
from voicert.speech.onnx_torch import OPS, TorchOnnx
from voicert.speech.smart_turn import SmartTurn, features, mel_extractor, model_path

RNG = np.random.default_rng(0)


def _one_node(op: str, inputs: dict[str, np.ndarray], **attrs) -> onnx.ModelProto:
    """A graph of one ``op`` node over ``inputs`` (the first a graph input, the rest constants)."""
    names = list(inputs)
    node = helper.make_node(op, names, ["y"], **attrs)
    first = inputs[names[0]]
    x = helper.make_tensor_value_info(
        names[0], helper.np_dtype_to_tensor_dtype(first.dtype), first.shape
    )
    y = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in list(inputs.items())[1:]]
    graph = helper.make_graph([node], "one", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _both(op: str, inputs: dict[str, np.ndarray], **attrs) -> tuple[np.ndarray, np.ndarray]:
    model = _one_node(op, inputs, **attrs)
    first = next(iter(inputs))
    want = ReferenceEvaluator(model).run(None, {first: inputs[first]})[0]
    ours = TorchOnnx(model).run(**{first: torch.from_numpy(inputs[first])}).numpy()
    return ours, want


def test_quantize_rounds_half_to_even_and_saturates_like_the_reference():
    x = np.array([[-300.0, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999, 126.5, 300.0]], np.float32)
    for zero in (np.uint8(128), np.int8(0)):
        ours, want = _both("QuantizeLinear", {"x": x, "s": np.float32(1.0), "z": np.array(zero)})
        np.testing.assert_array_equal(ours, want.astype(np.float32))


def test_dequantize_per_tensor_and_per_axis_equal_the_reference():
    q = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    ours, want = _both(
        "DequantizeLinear", {"q": q, "s": np.float32(0.03), "z": np.array(np.int8(3))}
    )
    np.testing.assert_array_equal(ours, want)
    scales = RNG.uniform(0.01, 0.1, 6).astype(np.float32)
    zeros = np.zeros(6, np.int8)
    ours, want = _both("DequantizeLinear", {"q": q, "s": scales, "z": zeros}, axis=1)
    np.testing.assert_array_equal(ours, want)


@pytest.mark.parametrize(
    "op, inputs, attrs",
    [
        ("Conv", {"x": (2, 3, 10), "w": (4, 3, 3), "b": (4,)}, dict(pads=[1, 1], strides=[2])),
        ("Gemm", {"a": (5, 3), "b": (4, 3), "c": (4,)}, dict(transB=1)),
        ("MatMul", {"a": (2, 5, 3), "b": (3, 4)}, {}),
        ("LayerNormalization", {"x": (2, 5, 6), "w": (6,), "b": (6,)}, dict(epsilon=1e-5)),
        ("Softmax", {"x": (2, 5, 6)}, dict(axis=1)),
        ("Erf", {"x": (3, 4)}, {}),
        ("Tanh", {"x": (3, 4)}, {}),
        ("Transpose", {"x": (2, 3, 4, 5)}, dict(perm=[0, 2, 1, 3])),
    ],
)
def test_each_float_operator_equals_the_reference(op, inputs, attrs):
    arrays = {k: RNG.standard_normal(shape).astype(np.float32) for k, shape in inputs.items()}
    ours, want = _both(op, arrays, **attrs)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op, extra, attrs",
    [
        ("Reshape", {"shape": np.array([0, -1], np.int64)}, {}),
        ("Slice", {"starts": np.array([1], np.int64), "ends": np.array([99], np.int64)}, {}),
        ("ReduceSum", {"axes": np.array([1], np.int64)}, dict(keepdims=0)),
    ],
)
def test_shape_driven_operators_equal_the_reference(op, extra, attrs):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    ours, want = _both(op, {"x": x, **extra}, **attrs)
    np.testing.assert_allclose(ours, want, rtol=1e-6)


def test_a_graph_with_an_operator_it_lacks_is_refused_naming_it():
    model = _one_node("Celu", {"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="Celu"):
        TorchOnnx(model)
    assert "Celu" not in OPS


@pytest.fixture(scope="module")
def clips() -> np.ndarray:
    """Model inputs [6, 80, 800] of the eval set's spoken turns."""
    mel = mel_extractor()
    return np.stack([features(wav(f"eval/u{i:02d}")[0], mel) for i in range(1, 7)])


def _onnxruntime(clips: np.ndarray) -> np.ndarray:
    run = smart_turn._onnx_graph(model_path(), 1, [smart_turn.LOGITS])
    return run(clips)[0].reshape(-1)


def test_smart_turn_on_torch_agrees_with_the_reference_as_closely_as_onnxruntime(clips):
    """The reference (onnx's evaluator, in numpy) is the graph's meaning; onnxruntime fuses the
    QDQ pairs into integer kernels, torch keeps them as float ops: both differ from it by a
    rounding here and there, which this int8 graph amplifies. Torch may not differ more."""
    model = onnx.load(str(model_path()))
    for o in model.opset_import:  # the evaluator's DequantizeLinear starts at opset 19
        if o.domain == "":
            o.version = max(o.version, 19)
    want = ReferenceEvaluator(model).run(None, {"input_features": clips})[0].reshape(-1)
    ours = TorchOnnx(model_path()).run(input_features=torch.from_numpy(clips)).numpy().reshape(-1)
    ort = _onnxruntime(clips)
    assert np.abs(ours - want).mean() <= 1.5 * np.abs(ort - want).mean() + 0.01
    assert ((ours > 0.5) == (want > 0.5)).mean() >= 5 / 6


def test_the_torch_device_scores_a_batch_as_its_parts(clips):
    graph = TorchOnnx(model_path())
    batch = graph.run(input_features=torch.from_numpy(clips)).numpy().reshape(-1)
    alone = [graph.run(input_features=torch.from_numpy(c[None])).item() for c in clips[:2]]
    np.testing.assert_allclose(batch[:2], alone, atol=1e-6)


def test_intermediate_values_come_out_by_name_beside_the_output(clips):
    names = [smart_turn.LOGITS, smart_turn.POOLED, smart_turn.FRAMES]
    graph = TorchOnnx(model_path(), outputs=names)
    p, pooled, frames = graph.run_all(input_features=torch.from_numpy(clips[:2]))
    whole = TorchOnnx(model_path()).run(input_features=torch.from_numpy(clips[:2]))
    np.testing.assert_array_equal(p.numpy(), whole.numpy())
    assert pooled.shape == (2, 384) and frames.shape == (2, 400, 384)
    with pytest.raises(ValueError, match="no value named nope"):
        TorchOnnx(model_path(), outputs=["nope"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smart_turn_on_the_gpu_agrees_with_the_cpu_as_onnxruntime_does(clips):
    cpu = TorchOnnx(model_path()).run(input_features=torch.from_numpy(clips)).numpy().reshape(-1)
    gpu = SmartTurn(device="cuda").score([np.zeros(16000, np.float32)])  # loads, and runs
    assert gpu.shape == (1,)
    graph = TorchOnnx(model_path(), "cuda")
    ours = graph.run(input_features=torch.from_numpy(clips)).cpu().numpy().reshape(-1)
    ort = _onnxruntime(clips)
    assert np.abs(ours - cpu).mean() <= np.abs(ort - cpu).mean() + 0.01
