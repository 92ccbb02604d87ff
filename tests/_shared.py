"""Lending the session's real engines to code that starts and stops its own."""


class SharedEngine:
    """The session's engine, lent out: starting and stopping it are no-ops."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def start(self):
        return None

    async def stop(self):
        return None
