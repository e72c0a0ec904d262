"""loopfuse's streams: the engine, the stream worker and the edges (CLI, client, hooks).

The words the code uses, one name per idea (docs/development.md: Glossary):

- **event**: one input a gateway publishes (``tool_call``, ``tool_result``,
  ``compaction``, ``run_ended``), keyed by its session; ``schemas.events`` is its model.
- **session** and **run**: a session is the history scope (``session_key``), a run the
  detection scope inside it (``run_id``).
- **tenant**: whose session it is, as the broker vouches for it: the input topics an
  event arrived on (``settings.TenantTopics``).
- **state**: what the engine keeps of one session (``engine.state.SessionState`` in
  Python, ``NativeState`` in Rust), and its bytes in the session table (``engine.state_codec``).
- **step**: one event applied to a state, the engine's pure function
  (``engine.step.Engine.step``; no I/O, no clock but the event's).
- **judge**: what steps: the Python engine (``engine.Engine``) or the native judge
  (``native/``, loaded by ``engine.native``, driven by ``engine.native_step``).
- **fold**: one session's events applied in turn, with a way back when one fails
  (``worker.fold``: ``PythonFold``, ``NativeFold``); the worker and ``replay`` fold.
- **verdict**: the answer to one call (allow / warn / block) or a run's ``abort``.
- **loop event**: the auditors' record of a warning or a critical, on the loop-events topic.
- **reply**: a verdict routed to the asking gateway's reply topic and partition
  (``reply_to``); a **dead letter** is an input that got no verdict, with why.
- **checkpoint**: the worker's write of the states changed since the last one, after
  the outputs they caused are on the broker, and before the input is acknowledged.
"""
