"""Writers: how one request's engine outputs reach its client (JSON, SSE, NDJSON, audio,
WebSocket), and the pure encoders of the chunks they frame."""
