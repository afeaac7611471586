"""The engine every generation runs on: request slots, the decode loop, EOS bookkeeping and streaming."""

from zonos.engine.engine import Engine, Request, RequestHandle, check_memory, slot_bytes

__all__ = ["Engine", "Request", "RequestHandle", "check_memory", "slot_bytes"]
