"""The engine's one error: two chapter functions disagree, or a request cannot run; the message names them."""


class EngineError(RuntimeError):
    """Two chapter functions disagree, or a request cannot run; the message names them."""
