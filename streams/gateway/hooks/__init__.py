"""``loopfuse hooks``: Claude Code, Codex CLI and Gemini CLI behind loopfuse through
their own hook systems (gateway side: no Faust).

* :mod:`.protocols` each agent's hook JSON in, its hook output out (pure);
* :mod:`.service`   ``loopfuse hooks serve``: the HTTP service around one gateway client;
* :mod:`.install`   ``loopfuse hooks install|uninstall|unit``: the agents' settings files.

docs/gateway-integration.md: Coding agents.
"""
