"""A laptop's tools: the demo, the simulator, the broker launchers (embedded Tansu,
Apache Kafka), a worker in a child process, the native engine's build.

Only the CLI (and the tests and benchmarks) import this package: nothing that runs in
a worker, a gateway or an operator command depends on it.
"""
