"""trioserve: an HTTP frontend for model-inference engines, on Trio structured concurrency."""

__version__ = "0.1.0"
