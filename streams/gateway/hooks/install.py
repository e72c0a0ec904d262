"""``loopfuse hooks install|uninstall``: the agents' hook settings, merged, never clobbered.

Each agent keeps its hooks in a JSON file of its own, as event -> list of matcher
groups -> list of hooks:

* Claude Code: ``~/.claude/settings.json`` (``--project``: ``./.claude/settings.json``),
  an ``http`` hook per event that POSTs to the service (on ``PreToolUse``,
  ``onFailure: "block"`` with ``--fail-closed``: a service that is down, slow or
  answers an error blocks the call);
* Codex CLI: ``~/.codex/hooks.json`` (``./.codex/hooks.json``), a ``command`` hook:
  ``curl`` piping the hook's JSON to the service (Codex has no http hook);
* Gemini CLI: ``~/.gemini/settings.json`` (``./.gemini/settings.json``), the same
  ``curl`` command hook (timeouts in milliseconds there).

A command hook without ``--fail-closed`` answers a failed ``curl -f`` (the service down,
slow, or answering an error) with a ``systemMessage`` the user sees, and the tool runs
(left to itself, curl's exit code makes Gemini block the call and Codex run it without
a word); with it, ``|| exit 2`` blocks the call with a line saying why (only before a tool: a Stop hook that fails closed
would keep the agent going). The entries this writes carry a mark (a header for
the http hook, a trailing shell comment for a command) by which install finds them
again (and replaces them, so installing twice changes nothing) and uninstall removes
exactly them; everything else in the file is kept as it was.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loopfuse.streams.gateway.hooks.protocols import Agent

DEFAULT_URL = "http://127.0.0.1:7311"
#: Seconds the agent gives one hook; the service's verdict timeout (5 s) is well under.
HOOK_TIMEOUT_SECONDS = 30
#: The mark of an http hook this writes (a header the service ignores).
MARK_HEADER = "X-Loopfuse-Hooks"
#: The mark of a command hook this writes (a shell comment at its end).
MARK_COMMENT = "# loopfuse-hooks"

#: The events each agent's hook is installed for (the service maps them, protocols.py).
EVENTS: dict[Agent, tuple[str, ...]] = {
    "claude": (
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "PostCompact",
        "Stop",
        "SessionEnd",
    ),
    "codex": ("PreToolUse", "PostToolUse", "PostCompact", "Stop"),
    "gemini": ("BeforeTool", "AfterTool", "SessionEnd"),
}


#: What a fail-open command hook tells the user when the service does not answer.
UNREACHABLE_OPEN = (
    "the loopfuse hooks service is unreachable: the call runs by the fail-open policy"
)
#: The event whose hook may fail closed.
PRE_TOOL: dict[Agent, str] = {"claude": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}


class InstallError(Exception):
    """A settings file that cannot be merged (not JSON, not an object): left untouched."""


@dataclass(frozen=True, slots=True)
class InstallOptions:
    project: bool = False  # ./.<agent>/ instead of ~/.<agent>/
    fail_closed: bool = False
    url: str = DEFAULT_URL
    token_env: str | None = None  # the variable holding the service's bearer token


def settings_path(agent: Agent, project: bool, home: Path, cwd: Path) -> Path:
    base = cwd if project else home
    name = "hooks.json" if agent == "codex" else "settings.json"
    return base / f".{agent}" / name


def hook_entry(agent: Agent, options: InstallOptions) -> dict[str, Any]:
    """The one hook this installs for every event of ``agent``."""
    url = f"{options.url.rstrip('/')}/{agent}"
    if agent == "claude":
        headers = {MARK_HEADER: "1"}
        entry: dict[str, Any] = {"type": "http", "url": url, "timeout": HOOK_TIMEOUT_SECONDS}
        if options.token_env:
            headers["Authorization"] = f"Bearer ${options.token_env}"
            entry["allowedEnvVars"] = [options.token_env]
        entry["headers"] = headers
        if options.fail_closed:
            entry["onFailure"] = "block"
        return entry
    command = curl_command(agent, url, options)
    if agent == "gemini":
        return {
            "type": "command",
            "name": "loopfuse",
            "command": command,
            "timeout": HOOK_TIMEOUT_SECONDS * 1000,
        }
    return {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_SECONDS}


def curl_command(agent: Agent, url: str, options: InstallOptions) -> str:
    """The shell command that hands the hook's JSON (stdin) to the service."""
    parts = [
        "curl",
        "-sSf",
        "--max-time",
        str(HOOK_TIMEOUT_SECONDS - 5),
        "-H",
        "Content-Type: application/json",
    ]
    command = shlex.join(parts)
    if agent == "codex":  # the Codex process, for the opt-in interrupt of an aborted run
        command += ' -H "X-Loopfuse-Agent-Pid: $PPID"'
    if options.token_env:
        command += f' -H "Authorization: Bearer ${options.token_env}"'
    command += " --data-binary @- " + shlex.quote(url)
    if options.fail_closed:
        reason = "blocked by the fail-closed policy: the loopfuse hooks service is unreachable"
        command += f" || {{ echo {shlex.quote(reason)} >&2; exit 2; }}"
    else:  # never silently: the user is told (Gemini would block on curl's own exit code)
        command += " || echo " + shlex.quote(json.dumps({"systemMessage": UNREACHABLE_OPEN}))
    return f"{command} {MARK_COMMENT}"


def is_ours(hook: Any) -> bool:
    if not isinstance(hook, dict):
        return False
    headers = hook.get("headers")
    if isinstance(headers, dict) and MARK_HEADER in headers:
        return True
    command = hook.get("command")
    return isinstance(command, str) and command.rstrip().endswith(MARK_COMMENT)


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InstallError(f"{path} is not JSON ({exc}); left as it is") from None
    if not isinstance(data, dict):
        raise InstallError(f"{path} is not a JSON object; left as it is")
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise InstallError(f"{path}: 'hooks' is not an object; left as it is")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    """Atomically, keeping the file's permissions (a new one: owner only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(data, out, indent=2, ensure_ascii=False)
            out.write("\n")
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _without_ours(groups: list[Any]) -> tuple[list[Any], bool]:
    """The event's matcher groups with this installer's hooks taken out (and groups
    left empty by that); whether any was there."""
    kept: list[Any] = []
    found = False
    for group in groups:
        inner = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(inner, list) or not any(is_ours(hook) for hook in inner):
            kept.append(group)
            continue
        found = True
        rest = [hook for hook in inner if not is_ours(hook)]
        if rest:
            kept.append({**group, "hooks": rest})
    return kept, found


def install(agent: Agent, options: InstallOptions, home: Path, cwd: Path) -> list[str]:
    """Merge this agent's hooks into its settings file; lines saying what changed."""
    path = settings_path(agent, options.project, home, cwd)
    data = _read(path)
    hooks: dict[str, Any] = dict(data.get("hooks") or {})
    added: list[str] = []
    updated: list[str] = []
    for event in EVENTS[agent]:
        # Only a pre-tool hook fails closed: a failing Stop hook that "blocks" would
        # keep the agent going, a failing post-tool one would only show an error.
        closed = options.fail_closed and event == PRE_TOOL[agent]
        entry = hook_entry(agent, replace(options, fail_closed=closed))
        groups = hooks.get(event)
        if not isinstance(groups, list):
            groups = []
        kept, found = _without_ours(groups)
        if found and [{"hooks": [entry]}] == [group for group in groups if group not in kept]:
            continue  # exactly this entry is there already
        (updated if found else added).append(event)
        hooks[event] = [*kept, {"hooks": [entry]}]
    if not added and not updated:
        return [f"{path}: loopfuse hooks already installed, nothing changed"]
    data["hooks"] = hooks
    _write(path, data)
    entry = hook_entry(agent, options)
    shown = entry.get("url") or entry.get("command")
    lines = [f"{path}:"]
    if added:
        lines.append(f"  added the loopfuse hook to {', '.join(added)}")
    if updated:
        lines.append(f"  replaced the loopfuse hook of {', '.join(updated)}")
    lines.append(f"  {entry['type']} hook ({PRE_TOOL[agent]}): {shown}")
    if agent == "claude":
        lines.append(
            "  fail policy: "
            + ("onFailure block (a dead service blocks)" if options.fail_closed else "open")
        )
    if agent == "codex":
        lines.append(
            "  Codex runs a new or changed hook only once trusted: review it with /hooks "
            "in codex (or codex exec --dangerously-bypass-hook-trust for one-off automation)"
        )
    return lines


def uninstall(agent: Agent, project: bool, home: Path, cwd: Path) -> list[str]:
    """Take this installer's hooks out of the agent's settings file; what changed."""
    path = settings_path(agent, project, home, cwd)
    data = _read(path)
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return [f"{path}: no loopfuse hooks, nothing changed"]
    removed = []
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept, found = _without_ours(groups)
        if not found:
            continue
        removed.append(event)
        if kept:
            hooks[event] = kept
        else:
            del hooks[event]
    if not removed:
        return [f"{path}: no loopfuse hooks, nothing changed"]
    if not hooks:
        del data["hooks"]
    _write(path, data)
    return [f"{path}:", f"  removed the loopfuse hook from {', '.join(removed)}"]


# -- keeping the service running ----------------------------------------------------------


def systemd_unit(command: list[str]) -> str:
    """A systemd user unit for ``loopfuse hooks serve`` (~/.config/systemd/user/)."""
    return f"""# ~/.config/systemd/user/loopfuse-hooks.service
# systemctl --user daemon-reload && systemctl --user enable --now loopfuse-hooks
[Unit]
Description=loopfuse hooks service (Claude Code, Codex CLI, Gemini CLI)
After=network-online.target

[Service]
ExecStart={shlex.join(command)}
# LOOPFUSE_BOOTSTRAP_SERVERS=... and any other LOOPFUSE_* setting, one per line
EnvironmentFile=%h/.config/loopfuse/hooks.env
Restart=always
RestartSec=2

[Install]
WantedBy=default.target
"""


def launchd_plist(command: list[str], bootstrap: str) -> str:
    """A launchd agent for ``loopfuse hooks serve`` (~/Library/LaunchAgents/)."""
    arguments = "\n".join(f"    <string>{_xml(part)}</string>" for part in command)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- ~/Library/LaunchAgents/dev.loopfuse.hooks.plist
     launchctl load -w ~/Library/LaunchAgents/dev.loopfuse.hooks.plist -->
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>dev.loopfuse.hooks</string>
  <key>ProgramArguments</key>
  <array>
{arguments}
  </array>
  <key>EnvironmentVariables</key>
  <dict>
    <key>LOOPFUSE_BOOTSTRAP_SERVERS</key>
    <string>{_xml(bootstrap)}</string>
  </dict>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <true/>
  <key>StandardErrorPath</key>
  <string>/tmp/loopfuse-hooks.log</string>
</dict>
</plist>
"""


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
