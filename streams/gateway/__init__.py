"""Runs in a gateway: the Python client that publishes a session's events and waits
for each call's verdict (the plugins in ``loopfuse.integrations`` build on it). No Faust."""
