"""The libraries of the ``gateway`` extra (httpx, prometheus-client, uvicorn), imported only by
the modules that talk HTTP: the OpenAI adapter, the engine telemetry, the gateway app and its
command. The shell (:mod:`adaptive_batcher.gateway.shell`) needs none of them.

Each such module imports them at its top inside ``try``; a missing one becomes the
``ImportError`` of :func:`missing_extra`, which names the extra.
"""

from __future__ import annotations

from typing import Final

__all__ = ["INSTALL_GATEWAY", "missing_extra"]

INSTALL_GATEWAY: Final = 'pip install "adaptive-batcher[gateway]"'
"""The command that installs the gateway extra."""


def missing_extra(needed_by: str, exc: ImportError) -> ImportError:
    """The error to raise (``from exc``) when ``needed_by`` cannot import a library of the extra:
    ``<needed_by> needs <library> (the gateway extra): pip install "adaptive-batcher[gateway]"``.
    """
    library = (exc.name or "a library").partition(".")[0]
    return ImportError(
        f"{needed_by} needs {library} (the gateway extra): {INSTALL_GATEWAY}", name=library
    )
