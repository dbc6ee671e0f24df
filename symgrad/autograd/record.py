"""``symgrad.record()``: keep every value a recorded graph needs, for the verifier.

Outside this context a node keeps only *weak* references to its inputs (no memory
cost), so values the backward never saved can be read only while the user's tensors
live. Inside it, nodes hold their inputs strongly, so ``symgrad.verify`` works even
after the user's variables are gone or a backward freed the saved tensors.
"""

from __future__ import annotations

__all__ = ["record", "is_recording"]

#: Non-empty while inside ``record()``; ``function._record`` reads it once per input.
_recording: list = []


class record:
    """Context manager (and decorator) under which nodes keep strong refs to their inputs.

    Example::

        with symgrad.record():
            loss = model(x).sum()
        loss.backward()            # frees saved tensors, as usual
        symgrad.verify(loss)       # still works: the inputs were kept
    """

    def __enter__(self) -> record:
        _recording.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for i in range(len(_recording) - 1, -1, -1):
            if _recording[i] is self:
                del _recording[i]
                break

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record():
                return fn(*args, **kwargs)

        return wrapper


def is_recording() -> bool:
    """True inside ``symgrad.record()``."""
    return bool(_recording)
