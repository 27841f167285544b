"""Argument parsing and fault settings of the simulator (pure)."""

import pytest

from llmplane.sim.cli import build_parser, config_from_args
from llmplane.sim.config import Faults


def parse(*argv: str):
    return config_from_args(build_parser().parse_args(["--model", "m", *argv]))


def test_defaults_and_flags():
    cfg = parse()
    assert (cfg.host, cfg.port, cfg.role, cfg.time_scale) == ("127.0.0.1", 8000, "both", 1.0)
    assert cfg.model_name == "m" and cfg.enable_prefix_caching
    cfg = parse(
        "--port", "0", "--time-scale", "0", "--max-num-seqs", "4", "--num-blocks", "100",
        "--block-size", "32", "--lora-modules", "a=/x", "b=/y", "--max-loras", "2",
        "--role", "decode", "--kv-transfer-latency", "0.1", "--served-model-name", "alias",
        "--fault-error-rate", "0.5", "--fault-error-codes", "500,503", "--fault-crash-after", "3",
        "--no-enable-prefix-caching", "--prefill-time-per-token", "0.001",
    )  # fmt: skip
    assert cfg.port == 0 and cfg.time_scale == 0 and cfg.max_num_seqs == 4
    assert cfg.lora_modules == {"a": "/x", "b": "/y"} and cfg.max_loras == 2
    assert cfg.role == "decode" and cfg.timing.kv_transfer == 0.1
    assert cfg.model_name == "alias" and not cfg.enable_prefix_caching
    assert cfg.faults.error_codes == [500, 503] and cfg.faults.crash_after == 3
    assert cfg.timing.prefill_per_token == 0.001


def test_bad_values_are_rejected():
    with pytest.raises(ValueError):
        parse("--max-num-seqs", "0")
    with pytest.raises(ValueError):
        parse("--time-scale", "-1")
    with pytest.raises(ValueError):
        parse("--fault-error-rate", "1.5")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--lora-modules", "nopath"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--role", "other"])


def test_fault_updates_are_validated_and_partial():
    f = Faults()
    f.update({"error_rate": 0.25, "error_codes": [429]})
    assert f.to_dict()["error_rate"] == 0.25 and f.error_codes == [429]
    for bad in ({"error_rate": -0.1}, {"error_codes": []}, {"error_codes": [200]},
                {"crash_after": -1}, {"hang_rate": "x"}, {"nope": 1}, {"slow_start": -2}):  # fmt: skip
        with pytest.raises(ValueError):
            f.update(bad)
    assert f.error_rate == 0.25  # a rejected update changes nothing
    f.update({"disconnect_after": None, "crash_after": None})
    assert f.disconnect_after is None
