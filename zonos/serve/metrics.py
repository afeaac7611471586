"""The counters the speech server's ``/metrics`` endpoint prints (Prometheus' text format)."""

from __future__ import annotations

import math
import threading

__all__ = ["TTFA_BUCKETS", "Metrics"]

TTFA_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    """Counters the ``/metrics`` endpoint prints in Prometheus' text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ttfa = [0] * (len(TTFA_BUCKETS) + 1)
        self.ttfa_sum = 0.0
        self.ttfa_count = 0
        self.requests: dict[tuple[str, int], int] = {}
        self.streams = 0  # HTTP streams open
        self.audio_seconds = 0.0

    def observe_ttfa(self, seconds: float) -> None:
        """Count one time to first audio."""
        with self.lock:
            i = next((k for k, edge in enumerate(TTFA_BUCKETS) if seconds <= edge), len(TTFA_BUCKETS))
            self.ttfa[i] += 1
            self.ttfa_sum += seconds
            self.ttfa_count += 1

    def count(self, route: str, status: int) -> None:
        """Count one answer of ``route`` with ``status``."""
        with self.lock:
            self.requests[route, status] = self.requests.get((route, status), 0) + 1

    def render(self, engine) -> str:
        """The counters, and ``engine``'s gauges unless it is None, in Prometheus' text format."""
        lines = [
            "# HELP zonos_ttfa_seconds Time from a speech request's arrival to its first audio bytes.",
            "# TYPE zonos_ttfa_seconds histogram",
        ]
        with self.lock:
            total = 0
            for edge, n in zip((*TTFA_BUCKETS, math.inf), self.ttfa):
                total += n
                le = "+Inf" if edge == math.inf else repr(edge)
                lines.append(f'zonos_ttfa_seconds_bucket{{le="{le}"}} {total}')
            lines += [f"zonos_ttfa_seconds_sum {self.ttfa_sum}", f"zonos_ttfa_seconds_count {self.ttfa_count}"]
            lines += [
                "# HELP zonos_requests_total Requests answered, by route and status.",
                "# TYPE zonos_requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'zonos_requests_total{{route="{route}",status="{status}"}} {n}')
            streams, audio = self.streams, self.audio_seconds
        lines += [
            "# HELP zonos_streams_open Speech responses being streamed.",
            "# TYPE zonos_streams_open gauge",
            f"zonos_streams_open {streams}",
            "# HELP zonos_audio_seconds_total Seconds of audio streamed.",
            "# TYPE zonos_audio_seconds_total counter",
            f"zonos_audio_seconds_total {audio}",
        ]
        if engine is not None:
            lines += [
                "# HELP zonos_engine_active Requests in the engine's slots.",
                "# TYPE zonos_engine_active gauge",
                f"zonos_engine_active {engine.active}",
                "# HELP zonos_engine_queued Requests waiting for a slot.",
                "# TYPE zonos_engine_queued gauge",
                f"zonos_engine_queued {engine.queued}",
                "# HELP zonos_engine_slots Decode slots.",
                "# TYPE zonos_engine_slots gauge",
                f"zonos_engine_slots {engine.slots.count}",
                "# HELP zonos_engine_steps_total Decode steps run.",
                "# TYPE zonos_engine_steps_total counter",
                f"zonos_engine_steps_total {engine.steps}",
                "# HELP zonos_engine_step_seconds_total Host seconds in decode steps (over steps_total: step time).",
                "# TYPE zonos_engine_step_seconds_total counter",
                f"zonos_engine_step_seconds_total {engine.step_seconds}",
            ]
        return "\n".join(lines) + "\n"
