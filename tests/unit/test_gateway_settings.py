"""The ``gateway:`` settings of a config file: each is checked against the type its
``GatewayConfig`` field declares, so a mistaken value is one clear error at load, never a
traceback later."""

from __future__ import annotations

import pytest

from llmplane.gateway.config import config_from_dict


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"maxBodyBytes": "16M"}, "gateway.maxBodyBytes: must be a whole number of at least 0"),
        ({"maxBodyBytes": 1.5}, "gateway.maxBodyBytes: must be a whole number"),
        ({"maxBodyBytes": True}, "gateway.maxBodyBytes: must be a whole number"),
        ({"saturationQueue": -1}, "gateway.saturationQueue: must be a number of at least 0"),
        ({"scrapeInterval": float("nan")}, "gateway.scrapeInterval: must be a number"),
        ({"defaultTimeout": "5s"}, "gateway.defaultTimeout: must be a number"),
        ({"flowControl": "yes"}, "gateway.flowControl: must be true or false"),
        ({"flowControlTtl": 0}, "gateway.flowControlTtl: must be a number of seconds above 0"),
        (
            {"flowControlBandBytes": 0},
            "gateway.flowControlBandBytes: must be a whole number of at least 1",
        ),
        ({"allowedHosts": [1]}, "gateway.allowedHosts: must be a list of strings"),
        ({"rateLimitTokenizers": ["m"]}, "gateway.rateLimitTokenizers: must be a mapping"),
        ({"usageLog": 3}, "gateway.usageLog: must be a string"),
        ({"maxClientConnections": -2}, "gateway.maxClientConnections: must be a whole number"),
        ({"allowedOrigins": ["http://a/b"]}, "gateway.allowedOrigins"),
    ],
)
def test_a_setting_of_the_wrong_type_or_range_is_refused_by_name(settings, message) -> None:
    with pytest.raises(ValueError) as refused:
        config_from_dict({"gateway": settings})
    assert str(refused.value).startswith(message), refused.value


def test_good_settings_pass_and_a_single_name_becomes_a_list() -> None:
    config = config_from_dict(
        {
            "gateway": {
                "saturationQueue": 3,  # a whole number where a number is declared
                "defaultTimeout": None,  # None where the field allows it
                "maxClientConnections": 0,
                "activatorHoldTimeout": float("inf"),
                "allowedHosts": "gw.example",
                "allowedOrigins": "https://app.example",
                "rateLimitTokenizers": {"m": "/tok"},
                "flowControl": False,
            }
        }
    )
    assert config.saturation_queue == 3 and config.default_timeout is None
    assert config.allowed_hosts == ["gw.example"]
    assert config.allowed_origins == ["https://app.example"]
