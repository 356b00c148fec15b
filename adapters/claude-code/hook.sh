#!/bin/sh
# Installed into each Claude Code generation's private area by the supervisor. Claude Code
# runs it for the hook events named in settings.json with the event's JSON on stdin; it
# forwards the event, unchanged, to the generation's supervisor over the lane socket and
# prints what the supervisor answers (for SessionStart: the contract as additional
# context). It holds no key and decides nothing.
exec "$MOSAIC_BIN" lane hook claude-code "$1"
