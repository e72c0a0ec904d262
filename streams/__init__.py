"""loopfuse: the detection engine, the stream adapter and the edges (CLI, client, broker)."""
