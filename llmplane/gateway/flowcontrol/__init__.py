"""Flow control: requests wait in the gateway, by priority band and fairly between tenants,
while every candidate endpoint is saturated (``queue.py`` the data structure, ``controller.py``
the gateway's side of it)."""

from llmplane.gateway.flowcontrol.controller import FlowControl
from llmplane.gateway.flowcontrol.queue import BANDS, FlowQueue, Full, Limits, Waiter

__all__ = ["BANDS", "FlowControl", "FlowQueue", "Full", "Limits", "Waiter"]
