"""Engine links: the protocols the engine client's :class:`~trioserve.engine.link.EngineLink`
interface is spoken over, one module each (``protocol.py``: trioserve's own). They import
the engine client's interface; it never imports them."""
