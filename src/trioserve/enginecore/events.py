"""A request's times as EngineCore's events tell them (its QUEUED and SCHEDULED events, on
the engine's clock), read as vLLM's output processor reads them for its latency figures."""

from __future__ import annotations

from .codec import EngineCoreEvent

#: ``EngineCoreEventType``: a request's events on the engine's clock.
EVENT_QUEUED = 1
EVENT_SCHEDULED = 2


class RequestTimes:
    """One request's queued and first scheduled times, read from its outputs' events
    (sent while the engine logs stats: vLLM's default), as vLLM's output processor reads
    them: a preemption's later SCHEDULED does not move the first."""

    __slots__ = ("queued", "scheduled")

    def __init__(self) -> None:
        self.queued = self.scheduled = 0.0

    def update(self, events: list[EngineCoreEvent]) -> None:
        for event in events:
            if event.type == EVENT_QUEUED:
                self.queued = event.timestamp
            elif event.type == EVENT_SCHEDULED and not self.scheduled:
                self.scheduled = event.timestamp

    @property
    def queue_time(self) -> float | None:
        """Seconds from queued to first scheduled (vLLM's ``request_queue_time``); None
        without both events."""
        if not self.queued or not self.scheduled:
            return None
        return max(0.0, self.scheduled - self.queued)


__all__ = ["EVENT_QUEUED", "EVENT_SCHEDULED", "RequestTimes"]
