"""loopfuse's native judge as a wheel (``pip install ./native``, built by maturin).

Nothing to import from here: ``loopfuse.streams.engine.native`` loads
``loopfuse_native._native`` when no build sits beside the engine's sources, and only
while the wheel was built from the engine modules installed beside it.
"""
