"""The routes: one module each, given the services they need (``services.py``)."""
