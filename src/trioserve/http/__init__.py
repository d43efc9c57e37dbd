"""The HTTP application: routes, request lifecycle, writers."""

from .app import App

__all__ = ["App"]
