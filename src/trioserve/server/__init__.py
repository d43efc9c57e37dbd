"""Serving the app: the HTTP servers (built-in and hypercorn), TLS, signals and the drain."""
