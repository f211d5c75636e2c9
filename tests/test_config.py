import pytest

from voicert.config import ConfigError, env_overrides, load_config


def test_default_yaml_loads_and_matches_dataclass_defaults():
    cfg = load_config(environ={})
    assert cfg.server.port == 8765
    assert cfg.models.llm == "embedded"
    assert cfg.vad.min_silence_ms == 400


def test_env_overrides_file_and_flags_override_env(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("server:\n  port: 9001\nllm:\n  max_new_tokens: 10\n")
    cfg = load_config(
        f,
        {"llm.max_new_tokens": "20"},
        environ={"VOICERT_SERVER__PORT": "9002", "VOICERT_LLM__MAX_NEW_TOKENS": "15"},
    )
    assert cfg.server.port == 9002
    assert cfg.llm.max_new_tokens == 20


def test_env_names_map_to_dotted_keys():
    assert env_overrides({"VOICERT_VAD__MIN_SILENCE_MS": "300", "OTHER": "x"}) == {
        "vad.min_silence_ms": "300"
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"server.port": "70000"}, "server.port"),
        ({"server.port": "abc"}, "expected int"),
        ({"server.nope": "1"}, "server.nope: unknown key"),
        ({"vad.threshold": "1.5"}, "vad.threshold"),
        ({"llm.device": "tpu"}, "llm.device"),
        ({"llm.prefill_graph_rows": "0"}, "llm.prefill_graph_rows"),
        ({"llm.fp8": "true"}, "llm.fp8: is a GPU option"),
        ({"llm.rounding": "stochastic"}, "llm.rounding: must be gptq or nearest"),
        ({"llm.device": "cuda", "llm.fp8": "true", "llm.int4": "true"}, "choose one"),
        ({"llm.kv_cache": "int4"}, "llm.kv_cache: must be model, int8 or fp8"),
        ({"llm.int4_group": "16"}, "llm.int4_group: must be 128, 64 or 32"),
        ({"llm.int4_activations": "int4"}, "llm.int4_activations: must be model or int8"),
        ({"llm.fp8_activations": "int8"}, "llm.fp8_activations: must be fp8 or model"),
        ({"llm.int4_activations": "int8"}, "llm.int4_activations: int8 needs llm.int4"),
        ({"llm.quant_head": "true"}, "llm.quant_head: needs llm.fp8 or llm.int4"),
        ({"llm.kv_cache": "int8"}, "llm.kv_cache: int8 and fp8 are GPU options"),
        (
            {"llm.kv_cache": "fp8", "llm.device": "cuda", "llm.engine": "simple"},
            "llm.kv_cache: int8 and fp8 need llm.engine: fast",
        ),
        ({"llm.spec_policy": "sometimes"}, "llm.spec_policy: must be adaptive or always"),
        ({"server.gc_freeze": "maybe"}, "server.gc_freeze"),
        ({"turn.detector": "vibes"}, "turn.detector"),
        ({"turn.pause_ms": "1700", "turn.max_silence_ms": "1600"}, "turn.max_silence_ms"),
        (
            {"turn.detector": "semantic", "turn.model": "none", "turn.text_cue": "false"},
            "turn.model",
        ),
        ({"turn.model": "none", "turn.model_path": "/x.onnx"}, "turn.model_path"),
        ({"turn.interrupt_ms": "10"}, "turn.interrupt_ms"),
        ({"turn.interrupt_check_ms": "-5"}, "turn.interrupt_check_ms"),
        ({"turn.interrupt_check_ms": "soon"}, "turn.interrupt_check_ms"),
        ({"tts.sessions": "-1"}, "tts.sessions"),
        ({"tts.first_threads": "-2"}, "tts.first_threads"),
        ({"tts.first_sessions": "0"}, "tts.first_sessions"),
        ({"tts.stream_frames": "-1"}, "tts.stream_frames"),
        ({"asr.denoise": "magic"}, "asr.denoise"),
        ({"asr.min_window_s": "0.5"}, "asr.min_window_s"),
        ({"asr.hosts": "0"}, "asr.hosts: must be in"),
        ({"asr.hosts": "2"}, "asr.hosts: above 1 needs asr.shared: true and server.workers >="),
        (
            {"asr.hosts": "2", "server.workers": "2", "asr.shared": "false"},
            "asr.hosts: above 1 needs asr.shared: true",
        ),
        ({"port": "1"}, "section.key"),
        ({"tools.functions": "no_colon"}, "tools.functions"),
        ({"tools.functions": "[1, 2]"}, "tools.functions: expected a list of strings"),
        ({"tools.choice": "sometimes"}, "tools.choice"),
        ({"tools.max_rounds": "0"}, "tools.max_rounds"),
        ({"tools.timeout_s": "0"}, "tools.timeout_s"),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, overrides, environ={})


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("server: 5\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar, environ={})


def test_a_key_given_twice_in_a_file_is_an_error_naming_it(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("tts:\n  workers: 2\n  threads: 1\n  workers: 4\n")
    with pytest.raises(ConfigError, match=r"(?s)not valid YAML.*'workers' is given twice.*line 4"):
        load_config(twice, environ={})


def test_a_file_extends_others_in_order_and_its_own_keys_win(tmp_path):
    (tmp_path / "base.yaml").write_text("server:\n  port: 9001\n  host: 0.0.0.0\n")
    (tmp_path / "agent.yaml").write_text("server:\n  port: 9002\ntools:\n  functions: [m:f]\n")
    top = tmp_path / "top.yaml"
    top.write_text("extends: [base.yaml, agent.yaml]\nllm:\n  max_new_tokens: 7\n")
    cfg = load_config(top, environ={})
    assert (cfg.server.port, cfg.server.host) == (9002, "0.0.0.0")
    assert cfg.tools.functions == ["m:f"] and cfg.llm.max_new_tokens == 7
    one = tmp_path / "one.yaml"
    one.write_text("extends: base.yaml\nserver:\n  port: 9003\n")
    assert (
        load_config(one, environ={}).server
        == load_config(None, {"server.port": "9003", "server.host": "0.0.0.0"}, environ={}).server
    )
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="at most 4 deep"):
        load_config(tmp_path / "loop.yaml", environ={})
    (tmp_path / "gone.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml, which does not exist"):
        load_config(tmp_path / "gone.yaml", environ={})


def test_tool_functions_come_comma_separated_from_a_flag():
    cfg = load_config(None, {"tools.functions": "a.b:f, c.py:g"}, environ={})
    assert cfg.tools.functions == ["a.b:f", "c.py:g"]


def test_a_bad_value_from_the_environment_names_the_variable():
    with pytest.raises(ConfigError) as bad:
        load_config(environ={"VOICERT_SERVER__PORT": "abc"})
    assert (
        str(bad.value) == "config server.port (from VOICERT_SERVER__PORT): expected int, got 'abc'"
    )
    with pytest.raises(ConfigError) as flag:  # a flag over the variable: the flag is at fault
        load_config(environ={"VOICERT_SERVER__PORT": "1"}, overrides={"server.port": "x"})
    assert "(from" not in str(flag.value)
