"""A request's times as EngineCore's events tell them (its QUEUED and SCHEDULED events, on
the engine's clock), read as vLLM's output processor reads them for its latency figures."""

from __future__ import annotations

from .codec import EngineCoreEvent

#: ``EngineCoreEventType``: a request's events on the engine's clock.
EVENT_QUEUED = 1
EVENT_SCHEDULED = 2


class RequestTimes:
    """One request's times on the engine's clock, as vLLM's output processor reads them for
    its latency figures: queued and first scheduled, from its outputs' events (sent while
    the engine logs stats: vLLM's default; a preemption's later SCHEDULED does not move the
    first), and its first and last output's step, from the timestamp of the batch each
    output came in (``EngineCoreOutputs.timestamp``)."""

    __slots__ = ("first_output", "last_output", "queued", "scheduled")

    def __init__(self) -> None:
        self.queued = self.scheduled = 0.0
        self.first_output = self.last_output = 0.0

    def update(self, events: list[EngineCoreEvent]) -> None:
        for event in events:
            if event.type == EVENT_QUEUED:
                self.queued = event.timestamp
            elif event.type == EVENT_SCHEDULED and not self.scheduled:
                self.scheduled = event.timestamp

    def output(self, timestamp: float) -> float | None:
        """An output of the request, in the batch of the engine's ``timestamp``: the gap
        since its previous output (vLLM's inter-token latency, one per output), None for
        the first."""
        last, self.last_output = self.last_output, timestamp
        if not self.first_output:
            self.first_output = timestamp
            return None
        return timestamp - last

    @property
    def queue_time(self) -> float | None:
        """Seconds from queued to first scheduled (vLLM's ``request_queue_time``); None
        without both events."""
        if not self.queued or not self.scheduled:
            return None
        return max(0.0, self.scheduled - self.queued)

    def phases(self) -> tuple[float, float, float] | None:
        """vLLM's prefill (first scheduled to first output), decode (first to last output)
        and inference (first scheduled to last output) times of a finished request; None
        without its SCHEDULED event or any output."""
        if not self.scheduled or not self.first_output:
            return None
        return (
            self.first_output - self.scheduled,
            self.last_output - self.first_output,
            self.last_output - self.scheduled,
        )


__all__ = ["EVENT_QUEUED", "EVENT_SCHEDULED", "RequestTimes"]
