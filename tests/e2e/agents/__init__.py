"""Claude Code, Codex CLI and Gemini CLI, each in its own agent loop against the scripted
model on loopback (tests/support/scripted_model.py): the package.json beside this file pins
them and the Node 24 they run on; ``./dev test`` installs them (npm ci) and runs these
tests last."""
