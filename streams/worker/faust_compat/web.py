"""Faust's web server with only the app's own pages (no table, router or stats views)."""

from __future__ import annotations

from faust.web.drivers.aiohttp import Web as AiohttpWeb


class OperatorsOnlyWeb(AiohttpWeb):
    """Faust's aiohttp web server without Faust's own views (see operators_only_web)."""

    default_blueprints = ()
    production_blueprints = ()
    debug_blueprints = ()
    optional_blueprints = ()


def operators_only_web() -> str:
    """The ``web`` URL of a Faust web driver that serves only the app's own pages.

    Faust mounts built-in views besides an app's own: ``/table`` (a table's
    contents: here, session state), ``/router``, statistics and an index at ``/``.
    Most have a setting, the index has none; this driver mounts none of them, so a
    worker serves exactly ``/metrics``, ``/ready`` and ``/livez``. Idempotent.
    """
    from faust.web.drivers import DRIVERS

    DRIVERS.data.setdefault("loopfuse", f"{__name__}:OperatorsOnlyWeb")
    return "loopfuse://"
