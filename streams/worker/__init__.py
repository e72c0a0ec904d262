"""Runs in the stream worker: the Faust app, the session processor, the fleet breaker.

Faust, RocksDB and the rest come with the ``[worker]`` extra. The session processor
(``processor``, ``progress``, ``metrics``) imports no Faust, so ``loopfuse replay``
runs it offline on the base install.
"""
