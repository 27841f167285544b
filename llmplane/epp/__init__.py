"""Endpoint picker for Envoy and the Gateway API Inference Extension (ext_proc over gRPC).

Envoy carries the bytes; llmplane's routing state and scheduler decide where they go
(``server.py`` lifecycle, ``picker.py`` the per-request stages, ``protocol.py`` the messages,
``envoy.py`` a matching Envoy bootstrap, ``cli.py`` ``llmplane epp``). Needs the ``epp`` extra
(grpcio, xds-protos).
"""
