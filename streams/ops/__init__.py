"""An operator's commands over the output topics and files: ``audit`` (and its HTML
report), ``tail``, ``notify``, ``config check``, and the topic reader they share."""
