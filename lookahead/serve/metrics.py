"""The server's Prometheus metrics (`GET /metrics`), one registry per server so that several can run in a process."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    """Counters, gauges and histograms the engine and the app update (thread-safe: prometheus_client's own)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("lookahead_requests", "Requests answered, by endpoint and outcome",
                                ["endpoint", "status"], registry=r)
        self.rows = Counter("lookahead_rows_finished", "Rows (choices) finished, by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter("lookahead_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.tokens = Counter("lookahead_generation_tokens", "Tokens generated, by lookup", ["lookup"], registry=r)
        self.row_forwards = Counter("lookahead_row_forwards", "Target forwards, counted per row taking part, by "
                                    "lookup (the prefill included)", ["lookup"], registry=r)
        self.drafted = Counter("lookahead_draft_tokens", "Draft tokens verified, by lookup", ["lookup"], registry=r)
        self.accepted = Counter("lookahead_accepted_tokens", "Draft tokens accepted, by lookup", ["lookup"],
                                registry=r)
        self.forwards = Counter("lookahead_forwards", "Batched target forwards (steps and prefills)", registry=r)
        self.tokens_per_forward = Gauge("lookahead_tokens_per_forward", "Generated tokens per row forward so far, "
                                        "by lookup ('all': every row)", ["lookup"], registry=r)
        self.acceptance = Gauge("lookahead_acceptance_rate", "Accepted / verified draft tokens so far, by lookup "
                                "('all': every row)", ["lookup"], registry=r)
        self.drafting = Gauge("lookahead_drafting", "1 where the engine's steps of up to this many rows verify "
                              "drafts, 0 where steps with drafts gave 10% fewer tokens per second than plain steps "
                              "there and drafting is cut (one step in 8 still tries)", ["rows"], registry=r)
        self.queue = Gauge("lookahead_queue_depth", "Rows waiting for their prefill", registry=r)
        self.running = Gauge("lookahead_running_rows", "Rows in the running batch", registry=r)
        self.ttft = Histogram("lookahead_time_to_first_token_seconds", "From arrival to the first token",
                              buckets=LATENCY, registry=r)
        self.per_token = Histogram("lookahead_time_per_output_token_seconds", "Per-token latency after the first "
                                   "token, per row", buckets=LATENCY, registry=r)
        self._totals: dict = {}  # lookup -> [tokens, row forwards, drafted, accepted]

    def row_done(self, row) -> None:
        """Count a finished (or cancelled) row."""
        lookup, c = row.drafting.lookup if row.index is not None else "none", row.stats
        self.rows.labels(row.finish).inc()
        self.tokens.labels(lookup).inc(len(row.out))
        self.row_forwards.labels(lookup).inc(c.forward_passes)
        self.drafted.labels(lookup).inc(c.draft_tokens)
        self.accepted.labels(lookup).inc(c.accepted_tokens)
        for key in (lookup, "all"):
            t = self._totals.setdefault(key, [0, 0, 0, 0])
            for i, v in enumerate((len(row.out), c.forward_passes, c.draft_tokens, c.accepted_tokens)):
                t[i] += v
            self.tokens_per_forward.labels(key).set(t[0] / max(t[1], 1))
            self.acceptance.labels(key).set(t[3] / max(t[2], 1))
        if row.first_token is not None:
            self.ttft.observe(row.first_token - row.submitted)
            if len(row.out) > 1:
                self.per_token.observe((row.finished - row.first_token) / (len(row.out) - 1))

    def text(self) -> bytes:
        return generate_latest(self.registry)
