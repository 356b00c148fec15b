#!/bin/sh
# Installed into each Codex generation's private CODEX_HOME by the supervisor. Codex runs
# it for the hook events in hooks.json with the event's JSON on stdin; it forwards the event,
# unchanged, to the generation's supervisor over the lane socket and prints what the
# supervisor answers (for SessionStart: the contract as additional context). It holds no
# key and decides nothing.
exec "$MOSAIC_BIN" lane hook codex "$1"
