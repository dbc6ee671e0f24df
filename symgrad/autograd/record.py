"""``symgrad.record()``: keep every value a recorded graph needs, for the verifier.

Outside this context a node keeps only *weak* references to its inputs (no memory
cost), so values the backward never saved can be read only while the user's tensors
live. Inside it, nodes hold their inputs strongly, so ``symgrad.verify`` works even
after the user's variables are gone or a backward freed the saved tensors.
"""

from __future__ import annotations

import weakref

from .node import _sequence

__all__ = ["record", "is_recording", "before_write", "keep", "written_since"]

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


# -- the values a recorded graph saw ------------------------------------------------------
# The verifier checks a graph at the values its tensors had when it was recorded. Two
# cheap facts make that possible:
#
# * every in-place write calls :func:`before_write` first, which stamps the storage with
#   (a number from the nodes' sequence counter, the version before the write): a node
#   made before the stamp saw the older values, and the stamp's version is the version it
#   saw. The last ``HISTORY`` writes are kept. Nothing is done per op.
# * under ``record()`` each node keeps, per input tensor that is not an op's output (a leaf
#   of the verifier's graph), a ``Kept`` entry holding the array it read. The array is
#   copied only when an in-place write is about to change it (copy on write), so a graph
#   whose leaves are never written costs nothing more; a parameter that an optimizer step
#   changes costs one copy per recorded graph still alive.

#: writes remembered per storage (a verifier can say "recorded at version v" for a graph
#: older than the last HISTORY writes only as "at most v")
HISTORY = 8

#: id(storage) -> [weakref(Kept)]: the entries that need a copy before that storage changes
_watch: dict = {}


class Kept:
    """The array one input of a node recorded under ``record()`` read, and its version."""

    __slots__ = ("tensor", "storage", "array", "version", "copied", "__weakref__")

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.storage = tensor._storage
        self.array = tensor._data
        self.version = tensor._storage.version
        self.copied = False


def _drop(key: int):
    def callback(ref) -> None:
        refs = _watch.get(key)
        if refs is not None:
            refs[:] = [r for r in refs if r is not ref and r() is not None]
            if not refs:
                del _watch[key]
    return callback


def keep(node, inputs) -> None:
    """Under ``record()``: note on ``node`` the arrays its non-op tensor inputs hold now."""
    entries = []
    for x in inputs:
        if getattr(x, "_grad_fn", True) is not None or not hasattr(x, "_storage"):
            continue
        st = x._storage
        key = id(st)
        refs = _watch.get(key)
        k = None
        if refs:
            for r in refs:
                c = r()
                if c is not None and c.tensor is x and not c.copied and c.array is x._data \
                        and c.version == st.version:
                    k = c
                    break
        if k is None:
            k = Kept(x)
            _watch.setdefault(key, []).append(weakref.ref(k, _drop(key)))
        entries.append(k)
    if entries:
        node._kept = tuple(entries)


def before_write(t, lost: bool = False) -> None:
    """Call before writing into ``t``'s storage in place (then bump its version): stamps
    the storage, and copies the arrays that graphs recorded under ``record()`` read.
    ``lost``: the write has happened already (a custom Function's dirty input), so those
    arrays are marked gone instead of copied."""
    st = t._storage
    try:
        hist = st.written
    except AttributeError:
        hist = st.written = []
    hist.append((next(_sequence), st.version))
    if len(hist) > HISTORY:
        del hist[0]
    refs = _watch.pop(id(st), None) if _watch else None
    if refs:
        from ..backends import backend_for

        be = backend_for(st.device_type)
        for r in refs:
            k = r()
            if k is not None and not k.copied and k.storage is st:
                k.array = None if lost else be.copy(k.array)
                k.copied = True


def written_since(t, seq: int) -> tuple[int, int, bool] | None:
    """``(version the node numbered seq saw, version now, exact)`` if ``t``'s storage was
    written in place after that node was made, else None. ``exact`` is False when the
    first write after it has left the last HISTORY (the first number is then an upper
    bound)."""
    hist = getattr(t._storage, "written", None)
    if not hist or hist[-1][0] < seq:
        return None
    for n, (stamp, version) in enumerate(hist):
        if stamp > seq:
            return version, t._storage.version, n > 0 or len(hist) < HISTORY
    return None
